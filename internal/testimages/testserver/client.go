package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The client side of the test server: endpoints that make the pod send requests and resolve names, and
// report what happened, so that a test sees the network from inside a pod.
//
//	/fetch?url=U&n=N&timeout=D      N GETs of U, each on a new connection; a Summary
//	/load/start?url=U&rate=R&keepalive=1
//	                                GETs of U at R a second in the background until /load/stop (one at a
//	                                time when keepalive is set, over one kept-alive connection if it lasts)
//	/load/stop                      stops the load and answers its Summary
//	/dns?name=N&type=T              resolves N with the pod's resolver (T: A, SRV, CNAME, PTR); a DNSAnswer
//	/dnsload?name=N&n=K&c=C         K lookups of N over C workers, each straight to the pod's first
//	                                nameserver (no search list); a DNSLoad

// Summary is what a series of requests saw.
type Summary struct {
	OK       int            `json:"ok"`
	Failed   int            `json:"failed"`
	Errors   []string       `json:"errors,omitempty"` // the first few
	Backends map[string]int `json:"backends"`         // answers by the hostname= line of the body
	// NewConns counts the connections opened; with keepalive, 1 means one connection carried everything.
	NewConns  int   `json:"newConns"`
	ElapsedMS int64 `json:"elapsedMS"`
	MaxMS     int64 `json:"maxMS"` // the slowest request
}

func (s *Summary) record(body string, err error, took time.Duration) {
	s.MaxMS = max(s.MaxMS, took.Milliseconds())
	if err != nil {
		s.Failed++
		if len(s.Errors) < 10 {
			s.Errors = append(s.Errors, err.Error())
		}
		return
	}
	s.OK++
	for _, line := range strings.Split(body, "\n") {
		if h, ok := strings.CutPrefix(line, "hostname="); ok {
			s.Backends[h]++
		}
	}
}

type client struct {
	mu   sync.Mutex
	load *load
}

type load struct {
	stop chan struct{}
	done chan Summary
}

func (c *client) register(mux *http.ServeMux) {
	mux.HandleFunc("/fetch", c.fetch)
	mux.HandleFunc("/load/start", c.startLoad)
	mux.HandleFunc("/load/stop", c.stopLoad)
	mux.HandleFunc("/dns", resolve)
	mux.HandleFunc("/dnsload", dnsLoad)
}

// get sends one GET with its own client; it reports the body and whether a new connection was opened.
func get(ctx context.Context, hc *http.Client, url string) (string, bool, error) {
	fresh := false
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { fresh = !info.Reused }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, url, nil)
	if err != nil {
		return "", false, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fresh, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return string(body), fresh, err
}

func httpClient(keepAlive bool, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: !keepAlive, MaxConnsPerHost: 1, TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		DialContext: (&net.Dialer{Timeout: timeout}).DialContext,
	}}
}

func (c *client) fetch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n, _ := strconv.Atoi(q.Get("n"))
	timeout, _ := time.ParseDuration(q.Get("timeout"))
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	hc := httpClient(false, timeout)
	sum := Summary{Backends: map[string]int{}}
	start := time.Now()
	for i := 0; i < max(n, 1); i++ {
		t := time.Now()
		body, fresh, err := get(r.Context(), hc, q.Get("url"))
		if fresh {
			sum.NewConns++
		}
		sum.record(body, err, time.Since(t))
	}
	sum.ElapsedMS = time.Since(start).Milliseconds()
	writeJSON(w, sum)
}

func (c *client) startLoad(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rate, _ := strconv.Atoi(q.Get("rate"))
	if rate <= 0 {
		http.Error(w, "rate must be a positive integer", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.load != nil {
		http.Error(w, "a load is running", http.StatusConflict)
		return
	}
	l := &load{stop: make(chan struct{}), done: make(chan Summary, 1)}
	c.load = l
	url, keepAlive := q.Get("url"), q.Get("keepalive") == "1"
	go func() {
		hc := httpClient(keepAlive, 5*time.Second)
		sum := Summary{Backends: map[string]int{}}
		start := time.Now()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for {
			select {
			case <-l.stop:
				wg.Wait()
				sum.ElapsedMS = time.Since(start).Milliseconds()
				l.done <- sum
				return
			case <-tick.C:
			}
			one := func() {
				t := time.Now()
				body, fresh, err := get(context.Background(), hc, url)
				mu.Lock()
				defer mu.Unlock()
				if fresh {
					sum.NewConns++
				}
				sum.record(body, err, time.Since(t))
			}
			if keepAlive {
				one() // in order, on the one connection
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); one() }()
		}
	}()
	fmt.Fprintln(w, "started")
}

func (c *client) stopLoad(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	l := c.load
	c.load = nil
	c.mu.Unlock()
	if l == nil {
		http.Error(w, "no load is running", http.StatusConflict)
		return
	}
	close(l.stop)
	writeJSON(w, <-l.done)
}

// DNSAnswer is what /dns resolved.
type DNSAnswer struct {
	Answers []string `json:"answers"`
	Error   string   `json:"error,omitempty"`
}

// resolve looks a name up with Go's resolver, which reads the pod's /etc/resolv.conf (search list and ndots
// included), as a program in the pod would.
func resolve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("name")
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	resolver := &net.Resolver{PreferGo: true}
	var ans DNSAnswer
	var err error
	switch q.Get("type") {
	case "", "A":
		ans.Answers, err = resolver.LookupHost(ctx, name)
	case "SRV":
		var srvs []*net.SRV
		_, srvs, err = resolver.LookupSRV(ctx, "", "", name)
		for _, s := range srvs {
			ans.Answers = append(ans.Answers, fmt.Sprintf("%s:%d", s.Target, s.Port))
		}
	case "CNAME":
		var cname string
		cname, err = resolver.LookupCNAME(ctx, name)
		ans.Answers = []string{cname}
	case "PTR":
		ans.Answers, err = resolver.LookupAddr(ctx, name)
	default:
		http.Error(w, "type must be A, SRV, CNAME or PTR", http.StatusBadRequest)
		return
	}
	if err != nil {
		ans.Error = err.Error()
	}
	writeJSON(w, ans)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// DNSLoad is what /dnsload measured.
type DNSLoad struct {
	Queries int     `json:"queries"`
	Failed  int     `json:"failed"`
	Error   string  `json:"error,omitempty"` // the first failure
	QPS     float64 `json:"qps"`
	P50US   int64   `json:"p50us"`
	P99US   int64   `json:"p99us"`
}

// dnsLoad sends A queries for one fully qualified name with Go's resolver, pinned to the first nameserver of
// /etc/resolv.conf, and reports throughput and latency percentiles.
func dnsLoad(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("name")
	n, _ := strconv.Atoi(q.Get("n"))
	workers, _ := strconv.Atoi(q.Get("c"))
	n, workers = max(n, 1), max(workers, 1)
	conf, _ := os.ReadFile("/etc/resolv.conf")
	var server string
	for _, line := range strings.Split(string(conf), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" && server == "" {
			server = net.JoinHostPort(f[1], "53")
		}
	}
	if server == "" {
		http.Error(w, "no nameserver in /etc/resolv.conf", http.StatusInternalServerError)
		return
	}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, server)
	}}
	lat := make([]time.Duration, n)
	var failed atomic.Int64
	var firstErr atomic.Value
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
				t := time.Now()
				_, err := resolver.LookupHost(ctx, name)
				lat[i] = time.Since(t)
				cancel()
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	out := DNSLoad{Queries: n, Failed: int(failed.Load()), QPS: float64(n) / elapsed.Seconds(),
		P50US: lat[(n-1)*50/100].Microseconds(), P99US: lat[(n-1)*99/100].Microseconds()}
	if e, ok := firstErr.Load().(string); ok {
		out.Error = e
	}
	writeJSON(w, out)
}
