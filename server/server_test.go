package server

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/freeport"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

func TestBootstrapPlan(t *testing.T) {
	member := func(name string, expect int) gossip.Member {
		return gossip.Member{Name: name, Status: gossip.StatusAlive, Meta: gossip.Meta{Role: gossip.RoleServer, RaftAddr: name + ":6444", BootstrapExpect: expect}}
	}
	cases := []struct {
		name    string
		self    string
		expect  int
		seen    []gossip.Member
		want    string // server IDs joined by commas, or "" when refused
		wantErr string
	}{
		{"too few", "a", 3, []gossip.Member{member("a", 3), member("b", 3)}, "", "2 of 3"},
		{"exact", "b", 3, []gossip.Member{member("c", 3), member("a", 3), member("b", 3)}, "a,b,c", ""},
		{"too many", "a", 3, []gossip.Member{member("a", 3), member("b", 3), member("c", 3), member("d", 3)}, "", "found 4 servers"},
		{"mismatched expect", "a", 3, []gossip.Member{member("a", 3), member("b", 3), member("c", 5)}, "", "bootstrap_expect 5"},
		{"self missing", "z", 3, []gossip.Member{member("a", 3), member("b", 3), member("c", 3)}, "", "not among"},
		{"single", "a", 1, []gossip.Member{member("a", 1)}, "a", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := bootstrapPlan(tc.self, tc.expect, tc.seen)
			var ids []string
			for _, s := range plan {
				ids = append(ids, s.ID)
			}
			if got := strings.Join(ids, ","); got != tc.want {
				t.Fatalf("plan = %q, want %q (err %v)", got, tc.want, err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// testPeer is one in-process server with its own ports on loopback.
type testPeer struct {
	cfg *config.Server
	srv *Server
}

func freePort(t testing.TB, ip string) int {
	t.Helper()
	return freeport.One(t, ip)
}

func newPeers(t testing.TB, n, expect int) []*testPeer {
	var peers []*testPeer
	var joins []string
	token := "server-test-token-0123456789"
	for i := 0; i < n; i++ {
		ip := "127.0.0.1"
		f := &config.ServerFile{
			Name: ptr(fmt.Sprintf("cp-%d", i)), DataDir: ptr(t.TempDir()), BindAddr: &ip, LogLevel: ptr("warn"),
			Ports: &config.PortsBlock{API: ptr(freePort(t, ip)), Raft: ptr(freePort(t, ip)), Gossip: ptr(freePort(t, ip))},
			Server: &config.ServerBlock{
				BootstrapExpect: &expect, RetryInterval: ptr("100ms"), Token: &token, ServerStabilizationTime: ptr("1s"),
				// hashicorp/raft's defaults, twice the production ones: four race-detector test packages at a
				// time on two cores (make test) starve leaders of CPU past a 250 ms lease, and the peers churned
				// through elections (an autopilot promotion never saw 1 s of one leader's rule).
				Raft: &config.RaftBlock{HeartbeatTimeout: ptr("1s"), ElectionTimeout: ptr("1s"), LeaderLeaseTimeout: ptr("500ms")},
			},
		}
		joins = append(joins, fmt.Sprintf("%s:%d", ip, *f.Ports.Gossip))
		cfg, err := config.LoadServer("", f)
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, &testPeer{cfg: cfg})
	}
	for _, p := range peers {
		p.cfg.RetryJoin = joins
	}
	return peers
}

func (p *testPeer) start(t testing.TB) {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Name: p.cfg.Name, Level: hclog.Warn, Output: testLog{t}})
	var err error
	for attempt := 0; attempt < 50; attempt++ { // a just-closed port can take a moment to free up
		if p.srv, err = New(p.cfg, logger, Options{LocalGossip: true}); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("starting %s: %v", p.cfg.Name, err)
}

func (p *testPeer) stop() {
	if p.srv != nil {
		p.srv.Shutdown()
		p.srv = nil
	}
}

type testLog struct{ t testing.TB }

func (l testLog) Write(b []byte) (int, error) { l.t.Logf("%s", b); return len(b), nil }

// configurations returns each running peer's view: "leader|id1,id2,..." (voters sorted).
func configurations(peers []*testPeer) []string {
	var out []string
	for _, p := range peers {
		if p.srv == nil {
			continue
		}
		servers, err := p.srv.Node().Servers()
		if err != nil {
			out = append(out, "error")
			continue
		}
		var ids []string
		for _, s := range servers {
			if s.Voter {
				ids = append(ids, s.ID)
			}
		}
		sort.Strings(ids)
		leader, _ := p.srv.Node().Leader()
		out = append(out, leader+"|"+strings.Join(ids, ","))
	}
	return out
}

// waitOneCluster waits until every running peer agrees on one leader and one configuration of want voters.
func waitOneCluster(t testing.TB, peers []*testPeer, want int) string {
	t.Helper()
	var agreed string
	// A bound, not a target: a joining server waits for gossip, its Raft certificate and autopilot's
	// promotion, which take longer on a machine loaded by the other test packages.
	rt.WaitFor(t, "one cluster", 60*time.Second, func() error {
		views := configurations(peers)
		for _, v := range views {
			parts := strings.SplitN(v, "|", 2)
			if v != views[0] || parts[0] == "" || len(strings.Split(parts[1], ",")) != want {
				return fmt.Errorf("views differ or incomplete: %v", views)
			}
		}
		agreed = views[0]
		return nil
	})
	return agreed
}

var bootstrapTrials = flag.Int("bootstrap.trials", 2, "random start orders in TestBootstrapRandomStartOrders")

func TestBootstrapRandomStartOrders(t *testing.T) {
	for trial := 0; trial < *bootstrapTrials; trial++ {
		seed := time.Now().UnixNano()
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewSource(seed))
			peers := newPeers(t, 3, 3)
			t.Cleanup(func() {
				for _, p := range peers {
					p.stop()
				}
			})
			var wg sync.WaitGroup
			for _, i := range r.Perm(3) {
				delay := time.Duration(r.Intn(1500)) * time.Millisecond
				wg.Add(1)
				go func(p *testPeer) {
					defer wg.Done()
					time.Sleep(delay)
					p.start(t)
				}(peers[i])
			}
			wg.Wait()
			waitOneCluster(t, peers, 3)
		})
	}
}

func TestRestartedClusterDoesNotBootstrapAgainAndNewServerJoins(t *testing.T) {
	peers := newPeers(t, 4, 3)
	t.Cleanup(func() {
		for _, p := range peers {
			p.stop()
		}
	})
	for _, p := range peers[:3] {
		p.start(t)
	}
	waitOneCluster(t, peers[:3], 3)
	for _, p := range peers[:3] {
		p.stop()
	}
	// Restart in reverse order: state exists, nobody bootstraps, the same cluster comes back.
	for i := 2; i >= 0; i-- {
		peers[i].start(t)
		if !peers[i].srv.Node().HasState() {
			t.Fatalf("%s restarted without its raft state", peers[i].cfg.Name)
		}
	}
	waitOneCluster(t, peers[:3], 3)
	// A fourth server with the same retry_join is added as a voter by the leader.
	peers[3].start(t)
	waitOneCluster(t, peers, 4)
}

func TestKubeconfigAndOperatorEndpoints(t *testing.T) {
	peers := newPeers(t, 1, 1)
	peers[0].start(t)
	t.Cleanup(peers[0].stop)
	waitOneCluster(t, peers, 1)
	s := peers[0].srv
	// The requests' deadline covers the waits below (readyz may take 20 s on a loaded machine under -race).
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rt.WaitFor(t, "admin kubeconfig", 10*time.Second, func() error {
		_, err := loadKubeconfigClient(s.KubeconfigPath())
		return err
	})
	c, _ := loadKubeconfigClient(s.KubeconfigPath())
	resp, err := c.get(ctx, "/v1/operator/raft/peers")
	if err != nil || resp != 200 {
		t.Fatalf("authenticated list-peers: %d %v", resp, err)
	}
	// The admin token works as well as the certificate, and a wrong one is refused.
	token, err := os.ReadFile(filepath.Join(s.cfg.DataDir, AdminTokenPath))
	if err != nil {
		t.Fatal(err)
	}
	c = c.withoutCert()
	c.token = strings.TrimSpace(string(token))
	if resp, err := c.get(ctx, "/v1/operator/raft/peers"); err != nil || resp != 200 {
		t.Fatalf("admin token list-peers: %d %v", resp, err)
	}
	c.token = "wrong"
	if resp, _ := c.get(ctx, "/v1/operator/raft/peers"); resp != 401 {
		t.Fatalf("wrong token got HTTP %d, want 401", resp)
	}
	c.token = ""
	rt.WaitFor(t, "anonymous readyz", 20*time.Second, func() error {
		if resp, err := c.get(ctx, "/readyz"); resp != 200 {
			return fmt.Errorf("HTTP %d %v", resp, err)
		}
		return nil
	})
	// The port's /readyz is the Kubernetes API's now. The bootstrap server's, which held the port before the
	// API was built, says not ready once the cluster has its CA: the port closes and opens again when the API
	// takes it, and a client told "ok" then would be refused for as long as the API takes to build.
	rec := httptest.NewRecorder()
	s.readyz(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "the Kubernetes API is starting") {
		t.Fatalf("the bootstrap server's /readyz with a cluster CA: HTTP %d %s", rec.Code, rec.Body)
	}
	// Anonymous users are admitted to the public paths only; anywhere else they are unauthenticated.
	if resp, _ := c.get(ctx, "/api/v1/namespaces"); resp != 401 {
		t.Fatalf("anonymous list of namespaces got HTTP %d, want 401", resp)
	}
}

func ptr[T any](v T) *T { return &v }
