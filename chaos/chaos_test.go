package chaos

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/localcluster"
)

var (
	chaosRounds     = flag.Int("chaos.rounds", 3, "rounds to run; 0: until every fault of the plan was injected once")
	chaosSeed       = flag.Uint64("chaos.seed", 0, "the run's seed (0: from the clock); round r uses seed+r, which the report prints")
	chaosPlan       = flag.String("chaos.plan", "kill-leader,partition-leader,pause-leader", "faults by name, with counts: kill-leader=100,partition-leader=20; \"all\" for each fault once")
	chaosPerRound   = flag.Int("chaos.faults-per-round", 1, "faults injected together in a round")
	chaosHold       = flag.Duration("chaos.hold", 6*time.Second, "how long a round's faults last")
	chaosSettle     = flag.Duration("chaos.settle", 3*time.Second, "traffic before the faults and after they heal")
	chaosKubeconfig = flag.String("chaos.kubeconfig", "", "an existing cluster (a context per server): traffic and checks only, no faults")
	chaosRecheck    = flag.String("chaos.recheck", "", "a history a failed round saved (round-N-seed-S.history.json): TestRecheck runs the linearizability check on it again")
	chaosRecheckFor = flag.Duration("chaos.recheck-timeout", 10*time.Minute, "how long TestRecheck gives the linearizability check")
	chaosReportDir  = flag.String("chaos.report-dir", "", "where porcupine visualizations of failed rounds go (default: a temporary directory, kept on failure)")
)

// TestChaos runs the suite: on a `skiff local` cluster it brings up (3 servers, 2 agents, real containerd),
// or, with -chaos.kubeconfig, on an existing cluster without faults. `make test` runs three rounds, `make
// chaos` the full plan; -chaos.seed replays a run.
func TestChaos(t *testing.T) {
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	reportDir := *chaosReportDir
	if reportDir == "" {
		reportDir = t.TempDir()
	}
	c := &Cluster{Kubeconfig: *chaosKubeconfig}
	if c.Kubeconfig == "" {
		requireLocalCluster(t)
		c.Local = upLocal(t, proctest.Binary(t))
		c.Kubeconfig = localcluster.ClusterKubeconfig(c.Local.Dir)
	}
	var plan []string
	if *chaosPlan != "all" {
		var err error
		if plan, err = PlanFromCounts(*chaosPlan); err != nil {
			t.Fatal(err)
		}
	}
	// The report (a line per round, the summary last) goes to the test log, and to report.txt in the report
	// directory, which `make chaos` prints whether the run passed or not (go test shows a passing test's log
	// only with -v).
	report, err := os.Create(filepath.Join(reportDir, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer report.Close()
	out := io.MultiWriter(report, &testWriter{t: t})
	ctx, cancel := context.WithTimeout(context.Background(), 23*time.Hour)
	defer cancel()
	sum, err := Run(ctx, c, Options{Rounds: *chaosRounds, Seed: seed, Plan: plan, FaultsPerRound: *chaosPerRound,
		Hold: *chaosHold, Settle: *chaosSettle, ReportDir: reportDir, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range sum.Failures {
		t.Error(f)
	}
	if len(sum.Failures) > 0 {
		t.Logf("porcupine visualizations, if any, are in %s", reportDir)
	}
}

// testWriter sends the report to the test log, a line at a time.
type testWriter struct {
	t   *testing.T
	buf strings.Builder
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	for {
		s := w.buf.String()
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			break
		}
		w.t.Log(s[:i])
		w.buf.Reset()
		w.buf.WriteString(s[i+1:])
	}
	return len(p), nil
}

// TestRecheck runs the linearizability check again on a saved history, with more time: a round whose check
// ran out of its minute is settled here.
func TestRecheck(t *testing.T) {
	if *chaosRecheck == "" {
		t.Skip("no -chaos.recheck history")
	}
	h, err := LoadHistory(*chaosRecheck)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckLinearizable(h, *chaosRecheckFor, ""); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d operations: linearizable", len(h.Ops))
}
