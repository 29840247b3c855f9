package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Options say what a run does.
type Options struct {
	// Rounds is how many rounds run; each injects FaultsPerRound faults from the plan (none on a cluster the
	// suite does not control). Zero on a cluster the suite controls: as many as it takes to inject every
	// fault of the plan once.
	Rounds int
	// Seed makes a run reproducible: round r uses Seed+r for its traffic and its fault choices.
	Seed uint64
	// Plan lists the faults to inject, by name, in an order the seed shuffles; the rounds take them in turn
	// and start over when it is used up. Empty: every fault, once each.
	Plan []string
	// FaultsPerRound is one or more; a round's faults are injected together and healed together.
	FaultsPerRound int
	// Hold is how long faults last before they are healed; Settle how long traffic runs before and after.
	Hold, Settle time.Duration
	// ReportDir receives a porcupine visualization of any history that is not linearizable.
	ReportDir string
	// Out receives the report: a line per round and a summary line last.
	Out io.Writer
}

// Summary totals a run.
type Summary struct {
	Rounds, FailedRounds int
	Ops                  int
	Faults               map[string]int
	Failures             []string
}

// String is the summary line `make chaos` prints last.
func (s Summary) String() string {
	names := make([]string, 0, len(s.Faults))
	for n := range s.Faults {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", n, s.Faults[n]))
	}
	return fmt.Sprintf("chaos summary: %d rounds, %d failed, %d operations; faults: %s", s.Rounds, s.FailedRounds, s.Ops, strings.Join(parts, " "))
}

// PlanFromCounts expands counts such as "kill-leader=100,pause-leader=20" into a plan.
func PlanFromCounts(spec string) ([]string, error) {
	var plan []string
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, n := item, 1
		if i := strings.IndexByte(item, '='); i >= 0 {
			name = item[:i]
			if _, err := fmt.Sscanf(item[i+1:], "%d", &n); err != nil || n < 0 {
				return nil, fmt.Errorf("plan item %q: want name=count", item)
			}
		}
		if _, ok := FaultByName(name); !ok {
			return nil, fmt.Errorf("plan item %q: no such fault", name)
		}
		for range n {
			plan = append(plan, name)
		}
	}
	return plan, nil
}

// Run runs the rounds and returns their summary; the error is only for a run that could not be carried out
// (a round whose checks fail is counted and reported, and the run goes on).
func Run(ctx context.Context, c *Cluster, opts Options) (Summary, error) {
	sum := Summary{Faults: map[string]int{}}
	if opts.FaultsPerRound < 1 {
		opts.FaultsPerRound = 1
	}
	plan := slices.Clone(opts.Plan)
	if len(plan) == 0 {
		for _, f := range Faults {
			plan = append(plan, f.Name)
		}
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x5eed))
	rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	next := 0
	more := func(r int) bool {
		if opts.Rounds == 0 && c.Local != nil {
			return next < len(plan)
		}
		return r < opts.Rounds
	}
	for r := 0; more(r) && ctx.Err() == nil; r++ {
		var faults []string
		if c.Local != nil {
			faults, plan = takeFaults(plan, next, opts.FaultsPerRound)
			next += len(faults)
		}
		res := runRound(ctx, c, opts, r, opts.Seed+uint64(r), faults)
		sum.Rounds++
		sum.Ops += res.ops
		for _, f := range faults {
			sum.Faults[f]++
		}
		status := "ok"
		if len(res.failures) > 0 {
			status = "FAILED"
			sum.FailedRounds++
			for _, f := range res.failures {
				sum.Failures = append(sum.Failures, fmt.Sprintf("round %d (seed %d, %v): %v", r, opts.Seed+uint64(r), faults, f))
			}
		}
		fmt.Fprintf(opts.Out, "round %d seed %d faults %v: %s; %s\n", r, opts.Seed+uint64(r), faults, status, res.describe())
		for _, f := range res.failures {
			fmt.Fprintf(opts.Out, "  %v\n", f)
		}
	}
	fmt.Fprintln(opts.Out, sum.String())
	return sum, ctx.Err()
}

// takeFaults takes a round's faults from the plan, from position next (wrapping around): up to n of them,
// or one that must run alone. A fault that must run alone and would join others is moved to the next
// position, so that it opens the following round; the plan keeps every fault it had.
func takeFaults(plan []string, next, n int) ([]string, []string) {
	plan = slices.Clone(plan)
	var out []string
	for i := next; len(out) < n && i < next+len(plan); i++ {
		name := plan[i%len(plan)]
		f, _ := FaultByName(name)
		switch {
		case f.Alone && len(out) == 0:
			return []string{name}, plan
		case f.Alone:
			continue // it opens a later round
		}
		if i%len(plan) != (next+len(out))%len(plan) {
			// Bring it forward, past the lone faults it skipped, so that positions stay in order.
			j, k := i%len(plan), (next+len(out))%len(plan)
			plan[j], plan[k] = plan[k], plan[j]
		}
		out = append(out, name)
	}
	return out, plan
}

// roundResult is what one round saw.
type roundResult struct {
	ops      int
	counts   map[string]int
	steps    []string
	failures []error
}

func (r *roundResult) describe() string {
	keys := make([]string, 0, len(r.counts))
	for k := range r.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.counts[k]))
	}
	return fmt.Sprintf("%d ops (%s); %s", r.ops, strings.Join(parts, " "), strings.Join(r.steps, "; "))
}

func (r *roundResult) fail(what string, err error) {
	if err != nil {
		r.failures = append(r.failures, fmt.Errorf("%s: %w", what, err))
	}
}

func (r *roundResult) step(format string, args ...any) {
	r.steps = append(r.steps, fmt.Sprintf(format, args...))
}

// runRound runs traffic and watches, injects the faults, heals them, and checks everything.
func runRound(ctx context.Context, c *Cluster, opts Options, round int, seed uint64, faults []string) *roundResult {
	res := &roundResult{}
	rng := rand.New(rand.NewPCG(seed, 0xfa17))
	before, err := GoroutineCounts(ctx, c.Kubeconfig)
	res.fail("goroutine counts before the round", err)

	// The same traffic and checks on ConfigMaps and on custom resources (fewer workers: the two share the
	// round's time).
	var streams []*roundTraffic
	for _, o := range []TrafficOptions{{Resource: ConfigMaps}, {Resource: CustomResources, Workers: 3}} {
		traffic, err := NewTraffic(c.Kubeconfig, seed, o)
		if err != nil {
			res.fail("starting traffic on "+o.Resource.String(), err)
			return res
		}
		defer traffic.Close()
		watchers, err := StartWatchers(ctx, c.Kubeconfig, traffic.Namespace(), o.Resource, seed)
		if err != nil {
			res.fail("starting watchers of "+o.Resource.String(), err)
			return res
		}
		streams = append(streams, &roundTraffic{traffic: traffic, watchers: watchers, hist: make(chan *History, 1)})
	}
	nodes := StartNodeWatch(ctx, c.Kubeconfig)
	defer nodes.Stop()
	var pods *PodSampler
	var short *ShortPods
	if c.Local != nil {
		did, err := applyWorkload(ctx, c.Kubeconfig, rng)
		res.fail("the workload", err)
		res.step("%s", did)
		pods = StartPodSampler(ctx, c.Local, workloadNamespace, []string{soloPod}, 500*time.Millisecond)
		short, err = StartShortPods(ctx, c.Kubeconfig, round)
		res.fail("short pods", err)
	}
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	for _, st := range streams {
		go func() { st.hist <- st.traffic.Run(trafficCtx) }()
	}

	sleep(ctx, opts.Settle)
	var heals []func(context.Context) error
	var faulted []FaultRecord
	for _, name := range faults {
		f, _ := FaultByName(name)
		start := time.Now()
		heal, err := f.Inject(ctx, c.Local, rng, func(format string, args ...any) { res.step(name+": "+format, args...) })
		res.fail("injecting "+name, err)
		if heal != nil {
			heals = append(heals, heal)
		}
		faulted = append(faulted, FaultRecord{Name: name, Start: start})
	}
	sleep(ctx, opts.Hold)
	for i := len(heals) - 1; i >= 0; i-- {
		res.fail("healing "+faults[i], heals[i](ctx))
	}
	for i := range faulted {
		faulted[i].End = time.Now()
	}
	took, err := CheckWritesResume(ctx, c.Kubeconfig, 5*time.Second)
	res.fail("writes after the faults healed", err)
	res.step("writes resumed %v after healing", took.Round(time.Millisecond))
	sleep(ctx, opts.Settle)
	stopTraffic()
	for _, st := range streams {
		st.check(ctx, res, opts, round, seed)
	}
	res.fail("replica convergence", CheckConvergence(ctx, c.Kubeconfig, 10*time.Second))
	res.fail("nodes", nodes.Check(faulted))
	if pods != nil {
		res.fail("a pod running twice", pods.Stop())
	}
	if short != nil {
		did, err := short.Check(ctx, time.Minute)
		res.step("%s", did)
		res.fail("a short pod run twice", err)
	}
	sleep(ctx, 2*time.Second) // watches and informers of the round wind down
	res.fail("goroutines", CheckGoroutines(ctx, c.Kubeconfig, before, 300))
	return res
}

// roundTraffic is one resource's traffic of a round, with its watchers.
type roundTraffic struct {
	traffic  *Traffic
	watchers *Watchers
	hist     chan *History
}

// check waits for the traffic's history and checks it: nothing lost, linearizable, fresh lists, and watches
// complete and in agreement with the history.
func (st *roundTraffic) check(ctx context.Context, res *roundResult, opts Options, round int, seed uint64) {
	hist := <-st.hist
	report := st.watchers.Stop()
	what := st.traffic.Resource().String()
	if res.counts == nil {
		res.counts = map[string]int{}
	}
	for k, n := range hist.Counts() {
		res.counts[k] += n
	}
	res.ops += len(hist.Ops)
	viz, saved := "", ""
	if opts.ReportDir != "" {
		viz = filepath.Join(opts.ReportDir, fmt.Sprintf("round-%d-seed-%d-%s.html", round, seed, what))
		saved = filepath.Join(opts.ReportDir, fmt.Sprintf("round-%d-seed-%d-%s.history.json", round, seed, what))
	}
	final, err := st.traffic.ReadFinal(ctx)
	res.fail("reading the final state of "+what, err)
	if err == nil {
		hist.Final = final
		res.fail("lost writes of "+what, CheckNoLostWrites(hist, final))
	}
	linErr := CheckLinearizable(hist, time.Minute, viz)
	res.fail("linearizability of "+what, linErr)
	if linErr != nil && saved != "" {
		// Kept so that the check can be run again, for longer, on the same history (-chaos.recheck).
		if err := SaveHistory(hist, saved); err != nil {
			res.step("saving the history: %v", err)
		} else {
			res.step("history saved to %s", saved)
		}
	}
	res.fail("list freshness of "+what, CheckListFreshness(hist))
	res.fail("watches of "+what, report.Check())
	res.fail("watches of "+what+" against the traffic", CheckWatchAgainstHistory(report, hist))
}

// FaultRecord is when a fault of a round was in force, for the node checks.
type FaultRecord struct {
	Name       string
	Start, End time.Time
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
