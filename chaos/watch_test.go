package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/skiff-dev/skiff/internal/servertest"
)

func ev(typ watch.EventType, name string, rv int64, value string) WatchEvent {
	return WatchEvent{Type: typ, Name: name, RV: rv, Value: value}
}

func bookmark(rv int64) WatchEvent { return WatchEvent{Type: watch.Bookmark, RV: rv} }

// cleanReport is a round that upholds every guarantee. The writes were: 10 a=1, 11 a=2, 12 b=3, 13 delete a,
// 14 b=4.
func cleanReport() *WatchReport {
	all := []WatchEvent{
		ev(watch.Added, "a", 10, "1"), ev(watch.Modified, "a", 11, "2"), ev(watch.Added, "b", 12, "3"),
		ev(watch.Deleted, "a", 13, "2"), ev(watch.Modified, "b", 14, "4"),
	}
	streams := []*WatchStream{
		// Everything from "now", with bookmarks.
		{Watcher: "s1/now-0", Server: "s1", Origin: OriginNow, StartRV: 9, Resumes: -1,
			Events: []WatchEvent{all[0], all[1], bookmark(11), all[2], all[3], all[4], bookmark(14), bookmark(14)}},
		// From a recent object's resourceVersion, on another server.
		{Watcher: "s2/recent-1", Server: "s2", Origin: OriginRecent, StartRV: 10, Resumes: -1, Events: all[1:]},
		// A stream the server ended after two events, and its resumption.
		{Watcher: "s1/recent-1", Server: "s1", Origin: OriginRecent, StartRV: 9, Resumes: -1, Events: all[:2]},
		{Watcher: "s1/recent-1", Server: "s1", Origin: OriginResume, StartRV: 11, Resumes: 2, Events: all[2:]},
		// 410 Gone at the start: the watcher relists, and starts after the list.
		{Watcher: "s2/recent-2", Server: "s2", Origin: OriginRecent, StartRV: 3, Resumes: -1, Err: "too old", Code: 410},
		{Watcher: "s2/recent-2", Server: "s2", Origin: OriginNow, StartRV: 12, Resumes: -1, Events: all[3:4]},
		// 410 Gone in the middle of a resumed stream: allowed too, and a fresh start from a later list.
		{Watcher: "s2/recent-2", Server: "s2", Origin: OriginResume, StartRV: 13, Resumes: 5, Events: []WatchEvent{bookmark(13)}, Err: "too old", Code: 410},
		{Watcher: "s2/recent-2", Server: "s2", Origin: OriginNow, StartRV: 14, Resumes: -1},
		// A server that was down: no event, an error.
		{Watcher: "s3/now-0", Server: "s3", Origin: OriginNow, Resumes: -1, Err: "listing for the start: connection refused"},
	}
	for i, s := range streams {
		s.ID = i
		s.Events = slices.Clone(s.Events) // the cases change them
	}
	return &WatchReport{Namespace: "chaos-1", Streams: streams}
}

func TestWatchReportClean(t *testing.T) {
	r := cleanReport()
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	if got := len(r.Union()); got != 5 {
		t.Fatalf("union has %d events, want 5: %v", got, r.Union())
	}
	if s := r.Summary(); !strings.Contains(s, "2 ended 410 Gone") {
		t.Fatalf("summary %q", s)
	}
}

// TestWatchReportGoneAllowed: a watcher whose every stream ends 410 Gone breaks no guarantee.
func TestWatchReportGoneAllowed(t *testing.T) {
	r := &WatchReport{Streams: []*WatchStream{
		{ID: 0, Origin: OriginRecent, StartRV: 2, Resumes: -1, Err: "too old", Code: 410},
		{ID: 1, Origin: OriginRecent, StartRV: 5, Resumes: -1, Events: []WatchEvent{ev(watch.Added, "a", 6, "1")}, Err: "too old", Code: 410},
		{ID: 2, Origin: OriginNow, StartRV: 7, Resumes: -1, Events: []WatchEvent{ev(watch.Added, "b", 8, "1")}},
	}}
	if !r.Streams[0].Gone() || r.Streams[2].Gone() {
		t.Fatal("Gone")
	}
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestWatchReportViolations(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(r *WatchReport)
		check  func(r *WatchReport) error
		want   string
	}{
		{"events out of order", func(r *WatchReport) {
			e := r.Streams[1].Events
			e[0], e[1] = e[1], e[0]
		}, (*WatchReport).CheckOrdered, "ordered: stream 1"},
		{"bookmark goes back", func(r *WatchReport) {
			r.Streams[0].Events = append(r.Streams[0].Events, bookmark(12))
		}, (*WatchReport).CheckOrdered, "bookmark 8 at rv=12 goes back"},
		{"bookmark before an earlier event", func(r *WatchReport) {
			r.Streams[1].Events = append(r.Streams[1].Events[:1], append([]WatchEvent{bookmark(10)}, r.Streams[1].Events[1:]...)...)
		}, (*WatchReport).CheckOrdered, "goes back before the event at rv=11"},
		{"bookmark below the start", func(r *WatchReport) {
			r.Streams[7].Events = []WatchEvent{bookmark(13)}
		}, (*WatchReport).CheckOrdered, "below the start"},
		{"event not newer than a bookmark", func(r *WatchReport) {
			r.Streams[0].Events[2] = bookmark(12) // then b=1 at rv=12 arrives
		}, (*WatchReport).CheckOrdered, "comes after a bookmark at rv=12"},
		{"event twice", func(r *WatchReport) {
			r.Streams[1].Events = append(r.Streams[1].Events, r.Streams[1].Events[1])
		}, (*WatchReport).CheckUnique, "unique: stream 1"},
		{"event dropped", func(r *WatchReport) {
			e := r.Streams[0].Events
			r.Streams[0].Events = append(e[:3:3], e[4:]...) // b=1 at 12
		}, (*WatchReport).CheckReliable, "reliable: stream 0 (s1/now-0 via s1, now from rv=9) misses ADDED b=3 rv=12"},
		{"events dropped before a bookmark", func(r *WatchReport) {
			r.Streams[2].Events = append(r.Streams[2].Events, bookmark(14))
		}, (*WatchReport).CheckReliable, "reliable: stream 2"},
		{"resumed stream skips its first event", func(r *WatchReport) {
			r.Streams[3].Events = r.Streams[3].Events[1:]
		}, (*WatchReport).CheckResumable, "resumable: stream 3 (s1/recent-1 via s1, resume from rv=11) starts with DELETED a=2 rv=13 but misses ADDED b=3 rv=12"},
		{"stream repeats its start", func(r *WatchReport) {
			r.Streams[3].Events = append([]WatchEvent{ev(watch.Modified, "a", 11, "2")}, r.Streams[3].Events...)
		}, (*WatchReport).CheckResumable, "not after its start"},
		{"servers disagree on a value", func(r *WatchReport) {
			r.Streams[1].Events[1].Value = "x"
		}, (*WatchReport).CheckAgreement, "agreement: at rv=12"},
		{"servers disagree on the type", func(r *WatchReport) {
			r.Streams[5].Events[0].Type = watch.Modified
		}, (*WatchReport).CheckAgreement, "agreement: at rv=13"},
		{"servers disagree on the object", func(r *WatchReport) {
			r.Streams[3].Events[2].Name = "c"
		}, (*WatchReport).CheckAgreement, "agreement: at rv=14"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := cleanReport()
			if err := tc.check(r); err != nil {
				t.Fatalf("clean report: %v", err)
			}
			tc.break_(r)
			err := tc.check(r)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if err := r.Check(); err == nil {
				t.Fatal("Check passes")
			}
		})
	}
}

// cleanHistory is the traffic behind cleanReport, with a write of unknown outcome that took effect and one
// that did not.
func cleanHistory() *History {
	return &History{Ops: []Op{
		{Kind: OpCreate, Key: "a", Value: "1", Outcome: OutcomeOK, RV: 10},
		{Kind: OpUpdate, Key: "a", Value: "2", Outcome: OutcomeUnknown},
		{Kind: OpCreate, Key: "b", Value: "3", Outcome: OutcomeOK, RV: 12},
		{Kind: OpDelete, Key: "a", Outcome: OutcomeOK},
		{Kind: OpUpdate, Key: "b", Value: "4", Outcome: OutcomeOK, RV: 14},
		{Kind: OpUpdate, Key: "b", Value: "5", Outcome: OutcomeUnknown},
		{Kind: OpGet, Key: "b", Outcome: OutcomeOK, Found: true, RV: 14, ReadValue: "4"},
	}}
}

func TestCheckWatchAgainstHistory(t *testing.T) {
	if err := CheckWatchAgainstHistory(cleanReport(), cleanHistory()); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		break_ func(r *WatchReport, h *History)
		want   string
	}{
		{"acknowledged write never delivered", func(r *WatchReport, h *History) {
			h.Ops = append(h.Ops, Op{Kind: OpCreate, Key: "c", Value: "9", Outcome: OutcomeOK, RV: 13})
		}, "acknowledged create c=9"},
		{"a value never written", func(r *WatchReport, h *History) {
			h.Ops[4].Value = "7"
		}, "a value the traffic never wrote"},
		{"a failed write delivered", func(r *WatchReport, h *History) {
			h.Ops[1].Outcome, h.Ops[1].Code = OutcomeFailed, 409
		}, "but the write failed"},
		{"delivered at another resourceVersion", func(r *WatchReport, h *History) {
			h.Ops[2].RV = 15
		}, "acknowledged at rv=15"},
		{"an update delivered as ADDED", func(r *WatchReport, h *History) {
			h.Ops[2].Kind = OpUpdate
		}, "for update b=3"},
		{"a delete never made", func(r *WatchReport, h *History) {
			h.Ops[3].Key = "b"
		}, "the traffic never deleted a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, h := cleanReport(), cleanHistory()
			tc.break_(r, h)
			err := CheckWatchAgainstHistory(r, h)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// clusterKubeconfig merges the peers' admin kubeconfigs into one with a context per server, cp-0 and on, as
// localcluster.State.WriteClusterKubeconfig does for a local cluster.
func clusterKubeconfig(t *testing.T, peers []*servertest.Peer) string {
	t.Helper()
	merged := clientcmdapi.NewConfig()
	for i, p := range peers {
		cfg, err := clientcmd.LoadFromFile(p.Server.KubeconfigPath())
		if err != nil {
			t.Fatal(err)
		}
		cur := cfg.Contexts[cfg.CurrentContext]
		name := fmt.Sprintf("cp-%d", i)
		merged.Clusters[name] = cfg.Clusters[cur.Cluster]
		merged.AuthInfos[name] = cfg.AuthInfos[cur.AuthInfo]
		merged.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
		if merged.CurrentContext == "" {
			merged.CurrentContext = name
		}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*merged, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// writer creates, updates and deletes ConfigMaps k0-k4 through the peers, recording what it does as the
// traffic would. A server that has not applied the last write yet may answer 409 or 404 (its local read is
// stale); a failover may leave a write's outcome unknown. After a failure the writer reads the key again.
type writer struct {
	t     *testing.T
	ns    string
	rng   *rand.Rand
	live  map[string]int64 // the keys that exist, with their resourceVersions
	hist  History
	fails int
}

func newWriter(t *testing.T, ns string) *writer {
	return &writer{t: t, ns: ns, rng: rand.New(rand.NewPCG(1, 2)), live: map[string]int64{}, hist: History{Namespace: ns}}
}

// run writes through peers for d, one write every 20 ms.
func (w *writer) run(ctx context.Context, peers []*servertest.Peer, d time.Duration) {
	t := w.t
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		p := w.rng.IntN(len(peers))
		cms := peers[p].Client.CoreV1().ConfigMaps(w.ns)
		key := fmt.Sprintf("k%d", w.rng.IntN(5))
		value := fmt.Sprint(len(w.hist.Ops))
		op := Op{Key: key, Value: value, Server: fmt.Sprint(p), Outcome: OutcomeOK}
		var cm *corev1.ConfigMap
		var err error
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		switch rv, ok := w.live[key]; {
		case !ok:
			op.Kind = OpCreate
			cm, err = cms.Create(wctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key}, Data: map[string]string{trafficDataKey: value}}, metav1.CreateOptions{})
		case w.rng.IntN(4) == 0:
			op.Kind, op.Value = OpDelete, ""
			if err = cms.Delete(wctx, key, metav1.DeleteOptions{}); err == nil {
				delete(w.live, key)
			}
		default:
			op.Kind = OpUpdate
			cm, err = cms.Update(wctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key, ResourceVersion: fmt.Sprint(rv)}, Data: map[string]string{trafficDataKey: value}}, metav1.UpdateOptions{})
		}
		cancel()
		switch code := statusCode(err); {
		case err == nil && cm != nil:
			if op.RV, err = parseRV(cm.ResourceVersion); err != nil {
				t.Fatal(err)
			}
			w.live[key] = op.RV
		case err == nil:
		case code == 409 || code == 404:
			op.Outcome, op.Code, op.Err = OutcomeFailed, code, err.Error()
		default:
			op.Outcome, op.Err = OutcomeUnknown, err.Error()
		}
		w.hist.Ops = append(w.hist.Ops, op)
		if err != nil {
			w.fails++
			w.refresh(ctx, peers, key)
		}
	}
	t.Logf("%d writes, %d failed", len(w.hist.Ops), w.fails)
}

// refresh reads a key again, through the first peer that answers.
func (w *writer) refresh(ctx context.Context, peers []*servertest.Peer, key string) {
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, p := range peers {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			cm, err := p.Client.CoreV1().ConfigMaps(w.ns).Get(rctx, key, metav1.GetOptions{})
			cancel()
			switch {
			case statusCode(err) == 404:
				delete(w.live, key)
				return
			case err == nil:
				w.live[key], _ = parseRV(cm.ResourceVersion)
				return
			}
		}
	}
	w.t.Fatalf("no server answers a read of %s", key)
}

// startWatchTest starts three servers, a kubeconfig with a context for each, and the traffic's namespace.
func startWatchTest(t *testing.T, ns string) ([]*servertest.Peer, string, context.Context) {
	if testing.Short() {
		t.Skip("starts three servers")
	}
	old := watchTimeout
	watchTimeout = [2]int{1, 3} // streams end, and watchers resume, several times
	t.Cleanup(func() { watchTimeout = old })
	peers := servertest.Start(t, 3)
	kubeconfig := clusterKubeconfig(t, peers)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	if _, err := peers[0].Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return peers, kubeconfig, ctx
}

// checkWatchReport runs the watch checks, with the writer's history, and checks the report is not empty.
func checkWatchReport(t *testing.T, report *WatchReport, w *writer) {
	t.Helper()
	t.Log(report.Summary())
	if err := report.Check(); err != nil {
		t.Fatal(err)
	}
	if err := CheckWatchAgainstHistory(report, &w.hist); err != nil {
		t.Fatal(err)
	}
	resumed := 0
	for _, s := range report.Streams {
		if s.Origin == OriginResume && len(s.objectEvents()) > 0 {
			resumed++
		}
	}
	if len(report.Union()) < len(w.hist.Ops)/2 || resumed == 0 {
		t.Fatalf("%d events in the union for %d writes, %d resumed streams with events", len(report.Union()), len(w.hist.Ops), resumed)
	}
}

// TestWatchersAndConvergence runs the watchers against three in-process servers while ConfigMaps are
// created, updated and deleted through all of them: every watch check passes, against the writes too, the
// servers converge, and the other cluster checks pass.
func TestWatchersAndConvergence(t *testing.T) {
	const ns = "chaos-watch-test"
	peers, kubeconfig, ctx := startWatchTest(t, ns)
	before := leaderGoroutineBaseline(t, ctx, peers, kubeconfig)
	nodes := StartNodeWatch(ctx, kubeconfig)
	watchers, err := StartWatchers(ctx, kubeconfig, ns, ConfigMaps, 42)
	if err != nil {
		t.Fatal(err)
	}
	w := newWriter(t, ns)
	w.run(ctx, peers, 5*time.Second)
	time.Sleep(time.Second) // the watchers catch up
	checkWatchReport(t, watchers.Stop(), w)

	took, err := CheckWritesResume(ctx, kubeconfig, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("writes through every server took %v", took)
	if err := CheckConvergence(ctx, kubeconfig, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := nodes.Check(nil); err != nil {
		t.Fatal(err)
	}
	if err := CheckGoroutines(ctx, kubeconfig, before, 300); err != nil {
		t.Fatal(err)
	}
}

// leaderGoroutineBaseline is the servers' settled goroutine counts (SettledGoroutineCounts), taken while one
// leader held office throughout, with writes going through every server. The three servers run in this
// process, so each reports the process's count: a baseline taken while none led (an election on a starved
// machine, as in a CI run) lacks the leader's scheduler and controllers, a few hundred goroutines, and the
// leak check failed once a leader ran them again.
func leaderGoroutineBaseline(t *testing.T, ctx context.Context, peers []*servertest.Peer, kubeconfig string) map[string]int {
	t.Helper()
	var last string
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			time.Sleep(time.Second)
		}
		leader, term := currentLeader(peers)
		if leader == "" {
			last = "no leader"
			continue
		}
		if _, err := CheckWritesResume(ctx, kubeconfig, 30*time.Second); err != nil {
			last = err.Error()
			continue
		}
		counts, err := SettledGoroutineCounts(ctx, kubeconfig)
		if err != nil || len(counts) != len(peers) {
			last = fmt.Sprintf("goroutine counts %v: %v", counts, err)
			continue
		}
		if now, nowTerm := currentLeader(peers); now != leader || nowTerm != term {
			last = fmt.Sprintf("leadership moved while counting: %s in term %d, then %q in term %d", leader, term, now, nowTerm)
			continue
		}
		return counts
	}
	t.Fatalf("no goroutine baseline under one leader: %s", last)
	return nil
}

// currentLeader is the peer that leads now, and its term; "" when none does.
func currentLeader(peers []*servertest.Peer) (string, uint64) {
	for _, p := range peers {
		if n := p.Server.Node(); n.IsLeader() {
			return n.ID(), n.Stats()["term"]
		}
	}
	return "", 0
}

// TestWatchersSurviveAServerShutdown shuts a server down while the watchers and writes run: its watchers
// record the failures, and the checks still pass; the other two converge.
func TestWatchersSurviveAServerShutdown(t *testing.T) {
	const ns = "chaos-watch-down"
	peers, kubeconfig, ctx := startWatchTest(t, ns)
	watchers, err := StartWatchers(ctx, kubeconfig, ns, ConfigMaps, 7)
	if err != nil {
		t.Fatal(err)
	}
	w := newWriter(t, ns)
	w.run(ctx, peers, 2*time.Second)
	down := time.Now()
	peers[2].Server.Shutdown()
	w.run(ctx, peers[:2], 3*time.Second)
	time.Sleep(time.Second)
	report := watchers.Stop()
	checkWatchReport(t, report, w)
	failed := 0
	for _, s := range report.Streams {
		if s.Server == "cp-2" && s.Started.After(down) && s.Err != "" && s.Err != errStopped {
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("no failed stream recorded on the server that was shut down")
	}
	if err := CheckConvergence(ctx, clusterKubeconfig(t, peers[:2]), 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestServerClientsNeedsAContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := StartWatchers(context.Background(), path, "ns", ConfigMaps, 1); err == nil {
		t.Fatal("no error for a kubeconfig without contexts")
	}
}
