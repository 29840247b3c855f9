// Command testserver is the HTTP server of the skiff/server test image: a container whose health, readiness,
// exit code and reaction to SIGTERM the tests steer over HTTP.
//
// It listens on all interfaces at the port of -port, whose default is $PORT or else 8080 (0 picks a free port;
// the start line printed to stdout, "testserver listening on ADDR", gives it). Endpoints:
//
//	/               "hostname=H\nmessage=M\nclient=ADDR\n", with the host name, $MESSAGE and the
//	                peer address the request came from
//	/healthz        200 "ok", or 500 once /fail has been called
//	/fail           makes /healthz fail from then on
//	/ready          200 "ready", or 503 once /unready has been called
//	/unready        makes /ready fail from then on
//	/exit?code=N    replies, then exits with code N
//	/file?path=P    the content of file P (404 if it does not exist)
//
// With -webhook-cert and -webhook-key it also serves HTTPS with that certificate and key, at the port of
// -webhook-port (default 8443; its start line, "testserver webhook listening on ADDR", follows the other), as an
// admission webhook (see webhook.go): POST /validate and POST /mutate. Both ports serve every endpoint.
//
// As a client, for network tests that need a pod's point of view (see client.go): /fetch, /load/start,
// /load/stop and /dns.
//
// With -get URL it serves nothing: it GETs URL once (apiget.go), with -bearer-file and -ca-file for a pod's
// service account credentials, prints "HTTP <code>" and the body, and exits (1 if no response came).
//
// On SIGTERM it prints "got SIGTERM" to stdout, and to the file -term-file names if any, then exits 0; with
// -ignore-sigterm it ignores SIGTERM, so that only SIGKILL stops it (for graceful-deletion tests).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
)

func main() {
	defaultPort := os.Getenv("PORT")
	if defaultPort == "" {
		defaultPort = "8080"
	}
	port := flag.String("port", defaultPort, "port to listen on (default $PORT, or else 8080)")
	ignoreTerm := flag.Bool("ignore-sigterm", false, "ignore SIGTERM")
	termFile := flag.String("term-file", "", "file to write \"got SIGTERM\" to on SIGTERM")
	getURL := flag.String("get", "", "GET this URL ($VAR expanded from the environment) once, print \"HTTP <code>\" and the body, and exit instead of serving")
	bearerFile := flag.String("bearer-file", "", "with -get: the file whose content is sent as a bearer token")
	caFile := flag.String("ca-file", "", "with -get: the CA certificates that verify the server")
	webhookCert := flag.String("webhook-cert", "", "the PEM certificate (chain) to serve HTTPS with, on -webhook-port; needs -webhook-key")
	webhookKey := flag.String("webhook-key", "", "the PEM private key of -webhook-cert")
	webhookPort := flag.String("webhook-port", "8443", "with -webhook-cert: the HTTPS port (0 picks a free port)")
	flag.Parse()
	if (*webhookCert == "") != (*webhookKey == "") {
		fmt.Fprintln(os.Stderr, "-webhook-cert and -webhook-key go together")
		os.Exit(2)
	}
	if *getURL != "" {
		if err := getOnce(os.ExpandEnv(*getURL), *bearerFile, *caFile); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}

	// Signal handling is set up before the start line is printed, so that a test that waits for the line may
	// signal at once.
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	} else {
		terms := make(chan os.Signal, 1)
		signal.Notify(terms, syscall.SIGTERM)
		go func() {
			<-terms
			fmt.Println("got SIGTERM")
			if *termFile != "" {
				if err := os.WriteFile(*termFile, []byte("got SIGTERM\n"), 0o644); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
			}
			os.Exit(0)
		}()
	}

	// Both listeners are open before the first start line is printed, so that a test that waits for it may
	// call either port at once.
	ln := listen(*port)
	var webhookLn net.Listener
	if *webhookCert != "" {
		webhookLn = tlsListener(*webhookPort, *webhookCert, *webhookKey)
	}
	var s server
	handler := s.handler()
	servers := []*http.Server{serve("testserver", ln, handler)}
	if webhookLn != nil {
		servers = append(servers, serve("testserver webhook", webhookLn, handler))
	}

	// /exit hands its code over here: Shutdown lets its reply finish before the process ends.
	code := <-s.exit
	for _, srv := range servers {
		_ = srv.Shutdown(context.Background())
	}
	os.Exit(code)
}

// serve prints the start line "NAME listening on ADDR" and serves handler on ln in the background; a failure
// to serve ends the process.
func serve(name string, ln net.Listener, handler http.Handler) *http.Server {
	srv := &http.Server{Handler: handler}
	fmt.Println(name, "listening on", ln.Addr())
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}()
	return srv
}

// listen opens a TCP listener on all interfaces at port, or exits.
func listen(port string) net.Listener {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return ln
}

// tlsListener is listen with TLS, with the certificate and key in the PEM files certFile and keyFile, or exits.
// They are read once: a test that changes them restarts the server.
func tlsListener(port, certFile, keyFile string) net.Listener {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "-webhook-cert, -webhook-key:", err)
		os.Exit(1)
	}
	return tls.NewListener(listen(port), &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
}

// server holds the state the endpoints toggle.
type server struct {
	failing atomic.Bool
	unready atomic.Bool
	exit    chan int
	client  client
}

func (s *server) handler() http.Handler {
	s.exit = make(chan int, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		host, _ := os.Hostname()
		fmt.Fprintf(w, "hostname=%s\nmessage=%s\nclient=%s\n", host, os.Getenv("MESSAGE"), r.RemoteAddr)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if s.failing.Load() {
			http.Error(w, "failing", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) {
		s.failing.Store(true)
		fmt.Fprintln(w, "/healthz fails from now on")
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		if s.unready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("/unready", func(w http.ResponseWriter, r *http.Request) {
		s.unready.Store(true)
		fmt.Fprintln(w, "/ready fails from now on")
	})
	mux.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil {
			http.Error(w, "code must be an integer", http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "exiting with code %d\n", code)
		select {
		case s.exit <- code:
		default: // another /exit is already under way
		}
	})
	mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(r.URL.Query().Get("path"))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			http.Error(w, err.Error(), http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			_, _ = w.Write(b)
		}
	})
	s.client.register(mux)
	registerWebhook(mux)
	return mux
}
