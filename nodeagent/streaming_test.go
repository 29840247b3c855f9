package nodeagent

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
)

// wantHTTPError checks that err is an httpError with code and a message holding msg.
func wantHTTPError(t *testing.T, err error, code int, msg string) {
	t.Helper()
	var he *httpError
	if !errors.As(err, &he) || he.code != code || !strings.Contains(he.msg, msg) {
		t.Fatalf("err = %#v, want HTTP %d with %q", err, code, msg)
	}
}

func streamsRunning(name, id string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, ContainerID: id, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
}

func streamsWaiting(name, reason string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
}

func streamsWithLast(s corev1.ContainerStatus, id string) corev1.ContainerStatus {
	s.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ContainerID: id, ExitCode: 1}
	return s
}

// streamsPod has a container status of each kind the log and stream requests must tell apart.
func streamsPod() *corev1.Pod {
	terminated := func(name, id string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, ContainerID: id, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ContainerID: id}}}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"}, Status: corev1.PodStatus{
		ContainerStatuses: []corev1.ContainerStatus{
			streamsWithLast(streamsRunning("restarted", "containerd://u-app-restarted-2"), "containerd://u-app-restarted-1"),
			streamsRunning("fresh", "containerd://u-app-fresh-0"),
			streamsWaiting("creating", "ContainerCreating"),
			streamsWaiting("noreason", ""),
			streamsWaiting("pull", "ErrImagePull"),
			streamsWaiting("backoff", "ImagePullBackOff"),
			streamsWaiting("config", "CreateContainerConfigError"),
			streamsWaiting("crashing-new", "CrashLoopBackOff"),
			streamsWithLast(streamsWaiting("crashing", "CrashLoopBackOff"), "containerd://u-app-crashing-4"),
			terminated("done", "containerd://u-app-done-0"),
			streamsWithLast(terminated("done-noid", ""), "containerd://u-app-done-noid-1"),
			terminated("gone", ""),
			streamsWithLast(terminated("restarted-done", "containerd://u-app-restarted-done-1"), "containerd://u-app-restarted-done-0"),
		},
		InitContainerStatuses:      []corev1.ContainerStatus{terminated("setup", "containerd://u-init-setup-0")},
		EphemeralContainerStatuses: []corev1.ContainerStatus{streamsRunning("debugger", "containerd://u-ephemeral-debugger-0")},
	}}
}

func TestLogContainer(t *testing.T) {
	pod := streamsPod()
	cases := []struct {
		name, container string
		previous        bool
		want            string
		wantErr         string // a 400 with this message
	}{
		{"running", "restarted", false, "containerd://u-app-restarted-2", ""},
		{"previous of a restarted container", "restarted", true, "containerd://u-app-restarted-1", ""},
		{"running, never restarted", "fresh", false, "containerd://u-app-fresh-0", ""},
		{"previous of a container never restarted", "fresh", true, "", `previous terminated container "fresh" in pod "web" not found`},
		{"previous of a waiting container", "creating", true, "", `previous terminated container "creating" in pod "web" not found`},
		{"creating", "creating", false, "", `container "creating" in pod "web" is waiting to start: ContainerCreating`},
		{"waiting without a reason", "noreason", false, "", `container "noreason" in pod "web" is waiting to start: ContainerCreating`},
		{"image pull error", "pull", false, "", `container "pull" in pod "web" is waiting to start: image can't be pulled`},
		{"image pull backoff", "backoff", false, "", `container "backoff" in pod "web" is waiting to start: trying and failing to pull image`},
		{"other waiting reason", "config", false, "", `container "config" in pod "web" is waiting to start: CreateContainerConfigError`},
		{"crash loop before any run", "crashing-new", false, "", "is waiting to start: CrashLoopBackOff"},
		{"crash loop shows the last run", "crashing", false, "containerd://u-app-crashing-4", ""},
		{"previous of a crash loop", "crashing", true, "containerd://u-app-crashing-4", ""},
		{"terminated", "done", false, "containerd://u-app-done-0", ""},
		{"terminated without an ID falls back to the last state", "done-noid", false, "containerd://u-app-done-noid-1", ""},
		{"terminated with nothing to show", "gone", false, "", `container "gone" in pod "web" is terminated`},
		{"terminated, current before last", "restarted-done", false, "containerd://u-app-restarted-done-1", ""},
		{"previous of a terminated container", "restarted-done", true, "containerd://u-app-restarted-done-0", ""},
		{"init container", "setup", false, "containerd://u-init-setup-0", ""},
		{"ephemeral container", "debugger", false, "containerd://u-ephemeral-debugger-0", ""},
		{"no status yet", "unknown", false, "", `container "unknown" in pod "web" is waiting to start: ContainerCreating`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := logContainer(pod, tc.container, tc.previous)
			if tc.wantErr != "" {
				wantHTTPError(t, err, http.StatusBadRequest, tc.wantErr)
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("logContainer = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestRunningContainerID(t *testing.T) {
	pod := streamsPod()
	cases := []struct {
		name, container string
		want            string
		wantErr         string // a 400 with this message
	}{
		{"running, prefix trimmed", "restarted", "u-app-restarted-2", ""},
		{"ephemeral", "debugger", "u-ephemeral-debugger-0", ""},
		{"creating", "creating", "", `container "creating" in pod "web" is waiting to start: ContainerCreating`},
		{"image pull error", "pull", "", "is waiting to start: image can't be pulled"},
		{"crash loop", "crashing", "", "is waiting to start: CrashLoopBackOff"},
		{"terminated", "done", "", `container "done" in pod "web" is not running`},
		{"terminated init container", "setup", "", `container "setup" in pod "web" is not running`},
		{"no status yet", "unknown", "", `container "unknown" in pod "web" is waiting to start: ContainerCreating`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := runningContainerID(pod, tc.container)
			if tc.wantErr != "" {
				wantHTTPError(t, err, http.StatusBadRequest, tc.wantErr)
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("runningContainerID = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestAttemptOf(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID("0b1c2d3e-aaaa-bbbb-cccc-1234567890ab")}}
	cases := []struct {
		id      string
		want    int
		wantErr bool
	}{
		{containerID(pod, "app", "web", 0), 0, false},
		{containerID(pod, "app", "my-side-car", 12), 12, false},
		{containerID(pod, "init", "setup-2", 3), 3, false},
		{containerID(pod, "ephemeral", strings.Repeat("long-", 12)+"abc", 11), 11, false},
		{"x-7", 7, false},
		{"noattempt", 0, true},
		{"", 0, true},
		{"uid-app-web-", 0, true},
		{"uid-app-web-two", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			got, err := attemptOf(tc.id)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("attemptOf(%q) = %d, %v; want %d (error %v)", tc.id, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestContainerIDFitsContainerd: any container name the API allows (a 63-character DNS label) gives an ID
// within containerd's limit, and names that share a long prefix get distinct IDs.
func TestContainerIDFitsContainerd(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID("0b1c2d3e-aaaa-bbbb-cccc-1234567890ab")}}
	seen := map[string]string{}
	for _, name := range []string{"web", strings.Repeat("a", 33), strings.Repeat("a", 62) + "b", strings.Repeat("a", 62) + "c",
		strings.Repeat("a-", 31) + "z"} {
		for _, kind := range []string{kindInit, kindApp, kindEphemeral} {
			id := containerID(pod, kind, name, 12345)
			if len(id) > maxContainerIDLen {
				t.Errorf("%s %q: id %q has %d characters; containerd takes %d", kind, name, id, len(id), maxContainerIDLen)
			}
			if !containerdIDPattern.MatchString(id) {
				t.Errorf("%s %q: id %q is not a valid containerd identifier", kind, name, id)
			}
			if other, ok := seen[id]; ok {
				t.Errorf("%q and %q share the id %q", other, kind+"/"+name, id)
			}
			seen[id] = kind + "/" + name
		}
	}
}

// containerdIDPattern is containerd's identifiers.Validate pattern.
var containerdIDPattern = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*$`)

func TestLogOptions(t *testing.T) {
	sinceTime := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name       string
		query      string
		follow     bool
		timestamps bool
		tailLines  *int64
		limitBytes *int64
		since      time.Duration // before now; 0 for none, -1 for sinceTime
		wantErr    string        // a 400 with this message
	}{
		{name: "none", query: ""},
		{name: "flags", query: "follow=true&timestamps=1", follow: true, timestamps: true},
		{name: "false flags", query: "follow=false&timestamps=0"},
		{name: "unparsable flag is false", query: "follow=sure"},
		{name: "tailLines", query: "tailLines=20", tailLines: new(int64(20))},
		{name: "tailLines 0", query: "tailLines=0", tailLines: new(int64(0))},
		{name: "limitBytes", query: "limitBytes=4096", limitBytes: new(int64(4096))},
		{name: "sinceSeconds", query: "sinceSeconds=60", since: time.Minute},
		{name: "sinceTime", query: "sinceTime=2024-01-02T03:04:05Z", since: -1},
		{name: "sinceTime with an offset", query: "sinceTime=2024-01-02T04:04:05%2B01:00", since: -1},
		{name: "everything", query: "follow=true&timestamps=true&tailLines=5&limitBytes=10&sinceSeconds=3600",
			follow: true, timestamps: true, tailLines: new(int64(5)), limitBytes: new(int64(10)), since: time.Hour},
		{name: "negative tailLines", query: "tailLines=-1", wantErr: `tailLines: "-1" is not a non-negative integer`},
		{name: "bad tailLines", query: "tailLines=all", wantErr: `tailLines: "all" is not a non-negative integer`},
		{name: "negative limitBytes", query: "limitBytes=-5", wantErr: `limitBytes: "-5" is not a non-negative integer`},
		{name: "bad limitBytes", query: "limitBytes=1k", wantErr: `limitBytes: "1k" is not a non-negative integer`},
		{name: "sinceSeconds 0", query: "sinceSeconds=0", wantErr: `sinceSeconds: "0" is not a positive integer`},
		{name: "bad sinceSeconds", query: "sinceSeconds=1m", wantErr: `sinceSeconds: "1m" is not a positive integer`},
		{name: "bad sinceTime", query: "sinceTime=yesterday", wantErr: `sinceTime: "yesterday" is not an RFC 3339 time`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			opts, err := logOptions(q)
			after := time.Now()
			if tc.wantErr != "" {
				wantHTTPError(t, err, http.StatusBadRequest, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if opts.Follow != tc.follow || opts.Timestamp != tc.timestamps {
				t.Errorf("follow %v timestamps %v, want %v %v", opts.Follow, opts.Timestamp, tc.follow, tc.timestamps)
			}
			for _, n := range []struct {
				name      string
				got, want *int64
			}{{"tailLines", opts.TailLines, tc.tailLines}, {"limitBytes", opts.LimitBytes, tc.limitBytes}} {
				if (n.got == nil) != (n.want == nil) || n.got != nil && *n.got != *n.want {
					t.Errorf("%s = %v, want %v", n.name, n.got, n.want)
				}
			}
			switch {
			case tc.since == 0:
				if !opts.Since.IsZero() {
					t.Errorf("since %v, want none", opts.Since)
				}
			case tc.since < 0:
				if !opts.Since.Equal(sinceTime) {
					t.Errorf("since %v, want %v", opts.Since, sinceTime)
				}
			default:
				if opts.Since.Before(before.Add(-tc.since)) || opts.Since.After(after.Add(-tc.since)) {
					t.Errorf("since %v, want %v before %v", opts.Since, tc.since, before)
				}
			}
		})
	}
}

// streamsTestCA is a CA that issues the certificates of the endpoint tests.
type streamsTestCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newStreamsTestCA(t *testing.T) *streamsTestCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &streamsTestCA{cert: cert, key: key, pool: pool}
}

// issue signs a leaf for tmpl's names and validity (an hour from now when tmpl has none).
func (ca *streamsTestCA) issue(t *testing.T, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	if tmpl.NotAfter.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func streamsClientCert(cn string, usage x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
}

// TestServersOnly serves serversOnly as the endpoint does (client certificates verified when given) and
// calls it with each kind of client.
func TestServersOnly(t *testing.T) {
	ca := newStreamsTestCA(t)
	serving := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "node-1"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	srv := httptest.NewUnstartedServer(serversOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "served "+r.URL.Path)
	})))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{serving}, ClientCAs: ca.pool,
		ClientAuth: tls.VerifyClientCertIfGiven, NextProtos: []string{"http/1.1"}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshakes are expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	other := newStreamsTestCA(t)

	cases := []struct {
		name     string
		cert     *tls.Certificate
		wantCode int    // 0: the TLS handshake fails
		wantBody string // part of the body
	}{
		{"no client certificate", nil, http.StatusUnauthorized, "needs the servers' client certificate"},
		{"the servers' certificate", new(ca.issue(t, streamsClientCert(join.AgentClientCN, x509.ExtKeyUsageClientAuth))), http.StatusOK, "served /containerLogs/ns/web/app"},
		{"another identity", new(ca.issue(t, streamsClientCert("system:node:node-2", x509.ExtKeyUsageClientAuth))), http.StatusForbidden, `"system:node:node-2" may not use the agent endpoint`},
		{"the admin's name", new(ca.issue(t, streamsClientCert("skiff-admin", x509.ExtKeyUsageClientAuth))), http.StatusForbidden, `"skiff-admin"`},
		{"the servers' CN from another CA", new(other.issue(t, streamsClientCert(join.AgentClientCN, x509.ExtKeyUsageClientAuth))), 0, ""},
		{"the servers' CN for server auth only", new(ca.issue(t, streamsClientCert(join.AgentClientCN, x509.ExtKeyUsageServerAuth))), 0, ""},
		{"the servers' CN, expired", new(ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: join.AgentClientCN},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			NotBefore:   time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})), 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tlsConfig := &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}
			if tc.cert != nil {
				tlsConfig.Certificates = []tls.Certificate{*tc.cert}
			}
			tr := &http.Transport{TLSClientConfig: tlsConfig}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(srv.URL + "/containerLogs/ns/web/app")
			if tc.wantCode == 0 {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("HTTP %d, want a failed handshake", resp.StatusCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode || !strings.Contains(string(body), tc.wantBody) {
				t.Fatalf("HTTP %d %q, want %d with %q", resp.StatusCode, body, tc.wantCode, tc.wantBody)
			}
		})
	}

	// Without TLS at all (a plain listener) there is no certificate either.
	rec := httptest.NewRecorder()
	serversOnly(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("plain HTTP: %d, want 401", rec.Code)
	}
}

func TestCertFits(t *testing.T) {
	ca := newStreamsTestCA(t)
	now := time.Now()
	leaf := func(dns []string, ips []string, notBefore time.Time, life time.Duration) *x509.Certificate {
		tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:node-1"}, DNSNames: dns,
			NotBefore: notBefore, NotAfter: notBefore.Add(life), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		for _, ip := range ips {
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
		}
		return ca.issue(t, tmpl).Leaf
	}
	const year = 365 * 24 * time.Hour
	cases := []struct {
		name          string
		nodeName      string
		advertiseAddr string
		leaf          *x509.Certificate
		want          bool
	}{
		{"fresh, name and address", "node-1", "10.0.0.5", leaf([]string{"node-1"}, []string{"10.0.0.5"}, now.Add(-time.Minute), year), true},
		{"no leaf", "node-1", "10.0.0.5", nil, false},
		{"another node's name", "node-2", "10.0.0.5", leaf([]string{"node-1"}, []string{"10.0.0.5"}, now.Add(-time.Minute), year), false},
		{"the address changed", "node-1", "10.0.0.6", leaf([]string{"node-1"}, []string{"10.0.0.5"}, now.Add(-time.Minute), year), false},
		{"no IP in the certificate", "node-1", "10.0.0.5", leaf([]string{"node-1"}, nil, now.Add(-time.Minute), year), false},
		{"no advertise address: the name is enough", "node-1", "", leaf([]string{"node-1"}, nil, now.Add(-time.Minute), year), true},
		{"a host name as advertise address is not checked as an IP", "node-1", "node-1.example", leaf([]string{"node-1"}, nil, now.Add(-time.Minute), year), true},
		{"79% of its life passed", "node-1", "10.0.0.5", leaf([]string{"node-1"}, []string{"10.0.0.5"}, now.Add(-year*79/100), year), true},
		{"81% of its life passed", "node-1", "10.0.0.5", leaf([]string{"node-1"}, []string{"10.0.0.5"}, now.Add(-year*81/100), year), false},
		{"expired", "node-1", "10.0.0.5", leaf([]string{"node-1"}, []string{"10.0.0.5"}, now.Add(-2*year), year), false},
		{"short-lived, 90% passed", "node-1", "10.0.0.5", leaf([]string{"node-1"}, []string{"10.0.0.5"}, now.Add(-54*time.Minute), time.Hour), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := &endpoint{cfg: &config.Agent{Name: tc.nodeName, AdvertiseAddr: tc.advertiseAddr, DataDir: t.TempDir()}}
			if got := e.certFits(tc.leaf); got != tc.want {
				t.Fatalf("certFits = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCancelOnClose: the context of a hijacked stream ends when its connection closes, from either side,
// and not before.
func TestCancelOnClose(t *testing.T) {
	cases := []struct {
		name        string
		serverClose bool // the server side closes the hijacked connection; else the client goes away
	}{
		{"client goes away", false},
		{"server closes", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hijacked := make(chan context.Context, 1)
			closeConn := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx, cancel := context.WithCancel(context.Background())
				cw := &cancelOnClose{ResponseWriter: w, cancel: cancel}
				conn, rw, err := cw.Hijack()
				if err != nil {
					cancel()
					t.Error(err)
					return
				}
				rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\nhello")
				rw.Flush()
				hijacked <- ctx
				if tc.serverClose {
					<-closeConn
					conn.Close()
					return
				}
				// As the stream server does: read until the client is gone.
				io.Copy(io.Discard, conn)
			}))
			t.Cleanup(srv.Close)
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, "GET /stream HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("response %v, %v", resp, err)
			}
			greeting := make([]byte, 5)
			if _, err := io.ReadFull(br, greeting); err != nil || string(greeting) != "hello" {
				t.Fatalf("read %q, %v", greeting, err)
			}
			var ctx context.Context
			select {
			case ctx = <-hijacked:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler did not hijack")
			}
			// The stream is open: its context lives on.
			io.WriteString(conn, "more data")
			select {
			case <-ctx.Done():
				t.Fatal("the context ended while the connection was open")
			case <-time.After(50 * time.Millisecond):
			}
			if tc.serverClose {
				close(closeConn)
			} else {
				conn.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the context did not end when the connection closed")
			}
		})
	}

	t.Run("not hijackable", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		rec := httptest.NewRecorder()
		cw := &cancelOnClose{ResponseWriter: rec, cancel: cancel}
		if _, _, err := cw.Hijack(); err == nil {
			t.Fatal("hijacked a response writer that cannot be")
		}
		cw.Flush()
		if !rec.Flushed {
			t.Error("Flush did not reach the response writer")
		}
		if ctx.Err() != nil {
			t.Fatal("a failed hijack ended the context")
		}
	})
}

func TestDialInNetns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	ctx := context.Background()

	t.Run("host namespace", func(t *testing.T) {
		conn, err := dialInNetns(ctx, "", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var server net.Conn
		select {
		case server = <-accepted:
		case <-time.After(10 * time.Second):
			t.Fatal("no connection reached the listener")
		}
		defer server.Close()
		if conn.RemoteAddr().String() != ln.Addr().String() || server.RemoteAddr().String() != conn.LocalAddr().String() {
			t.Fatalf("dialed %v from %v; the listener saw %v", conn.RemoteAddr(), conn.LocalAddr(), server.RemoteAddr())
		}
		io.WriteString(conn, "ping")
		buf := make([]byte, 4)
		if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("read %q, %v", buf, err)
		}
	})

	t.Run("refused", func(t *testing.T) {
		closed, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := closed.Addr().String()
		closed.Close()
		if conn, err := dialInNetns(ctx, "", addr); err == nil {
			conn.Close()
			t.Fatal("dialed a closed port")
		}
	})

	t.Run("missing namespace", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "no-such-netns")
		conn, err := dialInNetns(ctx, missing, ln.Addr().String())
		if err == nil {
			conn.Close()
			t.Fatal("dialed through a namespace that does not exist")
		}
		if !strings.Contains(err.Error(), "no-such-netns") && !strings.Contains(err.Error(), "/proc/thread-self") {
			t.Fatalf("err = %v, want one naming the namespace", err)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if conn, err := dialInNetns(cctx, "", ln.Addr().String()); err == nil {
			conn.Close()
			t.Fatal("dialed with a cancelled context")
		}
	})
}
