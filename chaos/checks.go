package chaos

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/skiff-dev/skiff/localcluster"
)

// Cluster-level checks for the runner: replica convergence, liveness after faults, node health during
// failover, pods running twice, goroutine leaks and graceful shutdown.

// raftStatePath is the operator endpoint each server answers with its own RaftState, read locally.
const raftStatePath = "/v1/operator/raft/state"

// raftState is a server's answer on raftStatePath (server.RaftState).
type raftState struct {
	Name         string `json:"name"`
	AppliedIndex uint64 `json:"appliedIndex"`
	StateHash    string `json:"stateHash"`
	Goroutines   int    `json:"goroutines"`
}

func (s raftState) String() string {
	h := s.StateHash
	if len(h) > 12 {
		h = h[:12]
	}
	return fmt.Sprintf("applied=%d hash=%s", s.AppliedIndex, h)
}

// readRaftState asks one server for its state.
func readRaftState(ctx context.Context, s serverClient) (raftState, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var st raftState
	raw, err := s.client.Discovery().RESTClient().Get().AbsPath(raftStatePath).Do(ctx).Raw()
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("%s: %w", raftStatePath, err)
	}
	return st, nil
}

// CheckConvergence polls every server's Raft state until all report the same applied index and state hash,
// for up to within. It fails at once when two servers report different hashes at the same applied index:
// their replicated states diverged.
func CheckConvergence(ctx context.Context, kubeconfig string, within time.Duration) error {
	servers, err := serverClients(kubeconfig)
	if err != nil {
		return err
	}
	type seenHash struct{ server, hash string }
	seen := map[uint64]seenHash{} // the first hash reported at each applied index
	last := make([]string, len(servers))
	deadline := time.Now().Add(within)
	for {
		states := make([]raftState, len(servers))
		errs := make([]error, len(servers))
		var wg sync.WaitGroup
		for i, s := range servers {
			wg.Go(func() { states[i], errs[i] = readRaftState(ctx, s) })
		}
		wg.Wait()
		agree := true
		for i, s := range servers {
			if errs[i] != nil {
				last[i], agree = fmt.Sprintf("%s: %v", s.name, errs[i]), false
				continue
			}
			st := states[i]
			last[i] = fmt.Sprintf("%s: %v", s.name, st)
			if prev, ok := seen[st.AppliedIndex]; !ok {
				seen[st.AppliedIndex] = seenHash{s.name, st.StateHash}
			} else if prev.hash != st.StateHash {
				return fmt.Errorf("replicas diverged: at applied index %d %s has state hash %s but %s has %s",
					st.AppliedIndex, prev.server, prev.hash, s.name, st.StateHash)
			}
			if errs[0] != nil || st.AppliedIndex != states[0].AppliedIndex || st.StateHash != states[0].StateHash {
				agree = false
			}
		}
		if agree {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("servers did not converge within %v: %s", within, strings.Join(last, "; "))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("servers did not converge: %w: %s", ctx.Err(), strings.Join(last, "; "))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// writesResumeNamespace holds the ConfigMaps CheckWritesResume writes; it always exists.
const writesResumeNamespace = "default"

// CheckWritesResume creates a ConfigMap through every server at once, each retrying until it succeeds, and
// fails for a server through which no create succeeded within `within`. It returns the longest time a
// server took (to its last attempt for a server that failed). The ConfigMaps are deleted afterwards.
func CheckWritesResume(ctx context.Context, kubeconfig string, within time.Duration) (time.Duration, error) {
	servers, err := serverClients(kubeconfig)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	took := make([]time.Duration, len(servers))
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() { took[i], errs[i] = writeUntil(ctx, s, start.Add(within)) })
	}
	wg.Wait()
	var failed []string
	var longest time.Duration
	for i, s := range servers {
		longest = max(longest, took[i])
		if errs[i] != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", s.name, errs[i]))
		}
	}
	if len(failed) > 0 {
		return longest, fmt.Errorf("no write succeeded within %v through %s", within, strings.Join(failed, "; "))
	}
	return longest, nil
}

// writeUntil creates a ConfigMap through one server, retrying until deadline, and returns how long it took.
func writeUntil(ctx context.Context, s serverClient, deadline time.Time) (time.Duration, error) {
	start := time.Now()
	cms := s.client.CoreV1().ConfigMaps(writesResumeNamespace)
	name := fmt.Sprintf("chaos-write-%s-%d", strings.ToLower(s.name), start.UnixNano())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"server": s.name}}
	var lastErr, earlierErr error
	for attempt := 0; ; attempt++ {
		attemptEnd := time.Now().Add(2 * time.Second)
		if deadline.Before(attemptEnd) {
			attemptEnd = deadline
		}
		rctx, cancel := context.WithDeadline(ctx, attemptEnd)
		_, err := cms.Create(rctx, cm, metav1.CreateOptions{})
		cancel()
		// AlreadyExists: an attempt whose answer was lost took effect (the name is this call's own).
		if err == nil || apierrors.IsAlreadyExists(err) {
			took := time.Since(start)
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = cms.Delete(dctx, name, metav1.DeleteOptions{})
			cancel()
			return took, nil
		}
		if lastErr != nil && !errors.Is(lastErr, context.DeadlineExceeded) {
			earlierErr = lastErr
		}
		lastErr = err
		if time.Now().After(deadline) || ctx.Err() != nil {
			if errors.Is(lastErr, context.DeadlineExceeded) && earlierErr != nil {
				// The last attempt was cut short by the deadline: the one before says more.
				return time.Since(start), fmt.Errorf("%d attempts, the last cut short, the one before: %w", attempt+1, earlierErr)
			}
			return time.Since(start), fmt.Errorf("%d attempts, the last: %w", attempt+1, lastErr)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// GoroutineCounts asks every server how many goroutines it runs: the goroutines field of its Raft state, or
// the go_goroutines metric when that endpoint is missing. A server that does not answer is left out of the
// map and named in the error.
func GoroutineCounts(ctx context.Context, kubeconfig string) (map[string]int, error) {
	servers, err := serverClients(kubeconfig)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	var errs []error
	for _, s := range servers {
		n, err := goroutineCount(ctx, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
			continue
		}
		out[s.name] = n
	}
	return out, errors.Join(errs...)
}

// SettledGoroutineCounts is GoroutineCounts once the counts have stopped rising: no server's grew by more
// than goroutineJitter over the last three one-second samples, or a minute has passed. A baseline taken right
// after a cluster starts would otherwise miss what the leader is still starting (the controllers' informers:
// the garbage collector's alone watch some sixty resources, a few hundred goroutines on both ends).
func SettledGoroutineCounts(ctx context.Context, kubeconfig string) (map[string]int, error) {
	deadline := time.Now().Add(time.Minute)
	var samples []map[string]int
	for {
		now, err := GoroutineCounts(ctx, kubeconfig)
		if err != nil {
			return now, err
		}
		samples = append(samples, now)
		if len(samples) >= 3 && !rising(samples[len(samples)-3], now) || time.Now().After(deadline) {
			return now, nil
		}
		select {
		case <-ctx.Done():
			return now, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// goroutineJitter is how much a server's goroutine count moves at rest (requests, heartbeats, timers).
const goroutineJitter = 20

// rising reports whether any server's count grew by more than goroutineJitter from then to now.
func rising(then, now map[string]int) bool {
	for name, n := range now {
		if was, ok := then[name]; !ok || n > was+goroutineJitter {
			return true
		}
	}
	return false
}

func goroutineCount(ctx context.Context, s serverClient) (int, error) {
	st, err := readRaftState(ctx, s)
	if err == nil && st.Goroutines > 0 {
		return st.Goroutines, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, err
	}
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	raw, err := s.client.Discovery().RESTClient().Get().AbsPath("/metrics").Do(mctx).Raw()
	if err != nil {
		return 0, err
	}
	return parseGoroutinesMetric(raw)
}

// parseGoroutinesMetric reads go_goroutines from a Prometheus text exposition.
func parseGoroutinesMetric(raw []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "go_goroutines" {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return 0, fmt.Errorf("go_goroutines %q: %w", f[1], err)
			}
			return int(v), nil
		}
	}
	return 0, errors.New("no go_goroutines metric in /metrics")
}

// goroutineSettle is how long CheckGoroutines waits for counts above the bound to come down.
var goroutineSettle = 10 * time.Second

// CheckGoroutines fails for a server that runs more than slack goroutines above the largest count any server
// ran at the round's start (before, taken by GoroutineCounts), still after goroutineSettle of re-sampling:
// watches and informers of the round take a while to end. The bound is the largest count, not the server's
// own, because leadership moves: a follower that becomes leader takes on the leader's scheduler and
// controllers (some 300 goroutines) without leaking any. Servers missing from before are skipped.
func CheckGoroutines(ctx context.Context, kubeconfig string, before map[string]int, slack int) error {
	deadline := time.Now().Add(goroutineSettle)
	most, busiest := 0, ""
	for name, was := range before {
		if was > most || (was == most && name < busiest) {
			most, busiest = was, name
		}
	}
	for {
		now, err := GoroutineCounts(ctx, kubeconfig)
		var over []string
		for name := range before {
			if n, ok := now[name]; ok && n > most+slack {
				over = append(over, fmt.Sprintf("%s runs %d goroutines; at the round's start the most was %d (%s), slack %d", name, n, most, busiest, slack))
			}
		}
		slices.Sort(over)
		if len(over) == 0 && err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if len(over) > 0 {
				err = errors.Join(append([]error{errors.New("goroutines leaked: " + strings.Join(over, "; "))}, err)...)
			}
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// NodeTransition is a change of a Node's Ready condition, as the NodeWatch saw it.
type NodeTransition struct {
	Node string
	// From is empty the first time the watch sees the Node; To is empty when the Node was deleted.
	From, To corev1.ConditionStatus
	Reason   string    // the condition's reason
	At       time.Time // the condition's lastTransitionTime (whole seconds), or Seen when it has none
	Seen     time.Time // when the watch saw it
}

func (t NodeTransition) String() string {
	from := string(t.From)
	if from == "" {
		from = "(first seen)"
	}
	return fmt.Sprintf("%s %s->%s (%s) at %s", t.Node, from, t.To, t.Reason, t.At.Format("15:04:05"))
}

// NodeWatch records every Ready transition of every Node over a round, through whichever server answers: a
// list, then a watch from it, and on any end the next server's list and watch.
type NodeWatch struct {
	cancel  context.CancelFunc
	done    chan struct{}
	started time.Time

	mu      sync.Mutex
	ready   map[string]corev1.ConditionStatus
	trans   []NodeTransition
	err     error  // the kubeconfig did not load: nothing was watched
	lastErr string // the last failure of a list or watch, for messages
	stopped time.Time
}

// NodeDetectionBound is how long a killed agent's Node may take to go Unknown: docs/operations.md ("Node
// health and lost nodes") documents 2.5-4 s on a small cluster; the bound leaves room for a loaded machine
// and a leader change.
var NodeDetectionBound = 40 * time.Second

// StartNodeWatch starts recording Node Ready transitions until Stop or until ctx ends. A kubeconfig that does
// not load is reported by Check.
func StartNodeWatch(ctx context.Context, kubeconfig string) *NodeWatch {
	nw := &NodeWatch{done: make(chan struct{}), started: time.Now(), ready: map[string]corev1.ConditionStatus{}}
	ctx, nw.cancel = context.WithCancel(ctx)
	servers, err := serverClients(kubeconfig)
	if err != nil {
		nw.err = err
		close(nw.done)
		return nw
	}
	go func() {
		defer close(nw.done)
		for i := 0; ctx.Err() == nil; i++ {
			if !nw.follow(ctx, servers[i%len(servers)]) {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	}()
	return nw
}

// follow lists and watches the Nodes through one server until the watch ends; false when it failed at once.
func (nw *NodeWatch) follow(ctx context.Context, s serverClient) bool {
	nodes := s.client.CoreV1().Nodes()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	list, err := nodes.List(lctx, metav1.ListOptions{})
	cancel()
	if err != nil {
		nw.failed(s, err)
		return false
	}
	nw.mu.Lock()
	listed := map[string]bool{}
	for i := range list.Items {
		listed[list.Items[i].Name] = true
		nw.observeLocked(&list.Items[i], false)
	}
	for name := range nw.ready {
		if !listed[name] {
			nw.observeLocked(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, true)
		}
	}
	nw.mu.Unlock()
	timeout := int64(30)
	// A partitioned server may never end the stream: give up some time after its timeout.
	wctx, cancel := context.WithTimeout(ctx, time.Duration(timeout+10)*time.Second)
	defer cancel()
	wi, err := nodes.Watch(wctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, TimeoutSeconds: &timeout})
	if err != nil {
		nw.failed(s, err)
		return false
	}
	defer wi.Stop()
	for ev := range wi.ResultChan() {
		node, ok := ev.Object.(*corev1.Node)
		switch {
		case ev.Type == watch.Error:
			nw.failed(s, apierrors.FromObject(ev.Object))
			return true
		case !ok:
			continue
		}
		nw.mu.Lock()
		nw.observeLocked(node, ev.Type == watch.Deleted)
		nw.mu.Unlock()
	}
	return true
}

func (nw *NodeWatch) failed(s serverClient, err error) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.lastErr = fmt.Sprintf("%s: %v", s.name, err)
}

// observeLocked records a transition if the Node's Ready status changed.
func (nw *NodeWatch) observeLocked(node *corev1.Node, deleted bool) {
	now := time.Now()
	prev, known := nw.ready[node.Name]
	t := NodeTransition{Node: node.Name, From: prev, At: now, Seen: now}
	if deleted {
		if !known {
			return
		}
		delete(nw.ready, node.Name)
		t.Reason = "deleted"
		nw.trans = append(nw.trans, t)
		return
	}
	status := corev1.ConditionStatus("")
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			status, t.Reason = c.Status, c.Reason
			if !c.LastTransitionTime.IsZero() {
				t.At = c.LastTransitionTime.Time
			}
		}
	}
	if status == "" {
		status = "None" // a Node without a Ready condition yet
	}
	if known && prev == status {
		return
	}
	nw.ready[node.Name] = status
	t.To = status
	nw.trans = append(nw.trans, t)
}

// Transitions returns the transitions seen so far, in the order seen.
func (nw *NodeWatch) Transitions() []NodeTransition {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return slices.Clone(nw.trans)
}

// Stop ends the watch and returns every transition it saw.
func (nw *NodeWatch) Stop() []NodeTransition {
	nw.cancel()
	<-nw.done
	nw.mu.Lock()
	if nw.stopped.IsZero() {
		nw.stopped = time.Now()
	}
	nw.mu.Unlock()
	return nw.Transitions()
}

// Check stops the watch and checks the transitions against the round's faults, by name (FaultRecord does not
// say which hosts a fault hit):
//   - the faults that hit only servers (kill-leader, full-crash, partitions of servers, ...) must leave every
//     Node alone: a leader failover does not make Nodes Unknown;
//   - during kill-agent, partition-agents and netem, and for NodeDetectionBound after them, any Node may go
//     Unknown, and so may it during a fault this check does not know;
//   - a kill-agent that lasted NodeDetectionBound makes some Node go Unknown within that bound.
//
// CheckNodesNotUnknownDuringFailover is the same check when the faulted agents are known.
func (nw *NodeWatch) Check(faulted []FaultRecord) error {
	trans := nw.Stop()
	if nw.err != nil {
		return fmt.Errorf("node watch: %w", nw.err)
	}
	var faults []AgentFault
	for _, f := range faulted {
		if serverOnlyFaults[f.Name] {
			continue
		}
		faults = append(faults, AgentFault{Kind: f.Name, Start: f.Start, End: f.End, MustDetect: f.Name == "kill-agent"})
	}
	return CheckNodesNotUnknownDuringFailover(trans, faults, NodeDetectionBound, nw.stopped)
}

// serverOnlyFaults are the faults of Faults that touch no agent: no Node may go Unknown for them.
var serverOnlyFaults = map[string]bool{
	"kill-leader": true, "kill-server": true, "pause-leader": true, "partition-leader": true, "partition-minority": true,
	"partition-oneway": true, "interrupted-transfer": true, "snapshot-install": true, "full-crash": true, "disk-full": true,
}

// AgentFault is a fault that hit an agent's host during a round.
type AgentFault struct {
	// Node is the agent's Node (its host name in a local cluster); empty for an agent not known, when any
	// Node may be the one.
	Node       string
	Kind       string    // what was done, for messages: kill, pause, partition...
	Start, End time.Time // End is zero for a fault still in force at the end of the round
	// MustDetect says the Node must go Unknown within the detection bound once the fault lasts that long:
	// the agent was killed, or cut off from every other host. A partial partition need not.
	MustDetect bool
}

func (f AgentFault) hits(node string) bool { return f.Node == "" || f.Node == node }

// CheckNodesNotUnknownDuringFailover checks the Ready transitions of a round (NodeWatch.Stop) against the
// agents really faulted in it: a Node that goes Unknown must be hit by a fault at the time (from its start
// until detect after its end); a MustDetect fault that lasted at least detect makes its Node (some Node, for
// a fault without one) go Unknown within detect of its start, unless it already was. end closes the faults
// still in force.
func CheckNodesNotUnknownDuringFailover(transitions []NodeTransition, faults []AgentFault, detect time.Duration, end time.Time) error {
	faultEnd := func(f AgentFault) time.Time {
		if f.End.IsZero() {
			return end
		}
		return f.End
	}
	var errs []error
	for _, t := range transitions {
		if t.To != corev1.ConditionUnknown || t.From == "" {
			continue
		}
		covered := false
		for _, f := range faults {
			if f.hits(t.Node) && !t.At.Before(f.Start.Add(-nodeTimeSlack)) && !t.At.After(faultEnd(f).Add(detect)) {
				covered = true
				break
			}
		}
		if !covered {
			errs = append(errs, fmt.Errorf("node %s went %s->Unknown at %s (seen %s, reason %q) while no fault hit its agent",
				t.Node, t.From, t.At.Format("15:04:05"), t.Seen.Format("15:04:05.000"), t.Reason))
		}
	}
	for _, f := range faults {
		if !f.MustDetect || faultEnd(f).Sub(f.Start) < detect {
			continue
		}
		unknownAtStart := map[string]bool{}
		detected := false
		var history []string
		for _, t := range transitions {
			if !f.hits(t.Node) {
				continue
			}
			history = append(history, t.String())
			if !t.At.After(f.Start) {
				unknownAtStart[t.Node] = t.To == corev1.ConditionUnknown
			} else if t.To == corev1.ConditionUnknown && !t.At.After(f.Start.Add(detect+nodeTimeSlack)) {
				detected = true
			}
		}
		for _, u := range unknownAtStart {
			detected = detected || u
		}
		if !detected {
			node := f.Node
			if node == "" {
				node = "(any)"
			}
			errs = append(errs, fmt.Errorf("node %s: %s at %s, but no Node went Unknown within %v (transitions: %s)",
				node, f.Kind, f.Start.Format("15:04:05"), detect, strings.Join(history, ", ")))
		}
	}
	return errors.Join(errs...)
}

// nodeTimeSlack covers lastTransitionTime's whole seconds.
const nodeTimeSlack = time.Second

// RunningContainer is a container task running (or paused) on an agent's host.
type RunningContainer struct {
	Host         string
	ID           string
	PodNamespace string // empty when read from the shim's state (Source "bundle")
	PodName      string
	Kind         string // sandbox, init, app or ephemeral
	// Source says how it was found: "containerd" (the agent's private containerd answered) or "bundle" (it
	// did not, as when the agent was killed: its containerd stops with it but the shims and containers run
	// on, so the running tasks are read from their bundles: the container ID, the pod's hostname and the
	// shim's init.pid).
	Source string
}

// agentContainerd is where an agent of a local cluster runs its private containerd (nodeagent: data_dir/containerd).
func agentContainerd(local *Local, host string) (string, error) {
	dir, err := filepath.Abs(local.Dir)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, host, "data", "containerd"), nil
}

// podContainerdNamespace is the containerd namespace the agents create everything in.
const podContainerdNamespace = "skiff"

// RunningContainers lists the running containers of every agent of the local cluster; a host that could not
// be read is named in the error.
func RunningContainers(ctx context.Context, local *Local) ([]RunningContainer, error) {
	var out []RunningContainer
	var errs []error
	for _, h := range local.State.Hosts {
		if h.Role != "agent" {
			continue
		}
		dir, err := agentContainerd(local, h.Name)
		if err != nil {
			return nil, err
		}
		cs, err := containerdRunning(ctx, filepath.Join(dir, "containerd.sock"))
		source := "containerd"
		if err != nil {
			var berr error
			if cs, berr = bundleRunning(filepath.Join(dir, "state", "io.containerd.runtime.v2.task", podContainerdNamespace)); berr != nil {
				errs = append(errs, fmt.Errorf("%s: containerd: %v; bundles: %w", h.Name, err, berr))
				continue
			}
			source = "bundle"
		}
		for _, c := range cs {
			c.Host, c.Source = h.Name, source
			out = append(out, c)
		}
	}
	return out, errors.Join(errs...)
}

// containerdRunning asks an agent's containerd for its running tasks and their containers' pod labels.
func containerdRunning(ctx context.Context, socket string) ([]RunningContainer, error) {
	if _, err := os.Stat(socket); err != nil {
		return nil, err
	}
	client, err := containerd.New(socket, containerd.WithDefaultNamespace(podContainerdNamespace), containerd.WithTimeout(2*time.Second))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tasks, err := client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		return nil, err
	}
	running := map[string]bool{}
	for _, t := range tasks.GetTasks() {
		switch t.GetStatus() {
		case tasktypes.Status_RUNNING, tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
			// A task's ID is its container's; ContainerID is only set for exec processes.
			running[cmp.Or(t.GetContainerID(), t.GetID())] = true
		}
	}
	ctrs, err := client.ContainerService().List(ctx)
	if err != nil {
		return nil, err
	}
	var out []RunningContainer
	for _, c := range ctrs {
		if running[c.ID] {
			out = append(out, RunningContainer{
				ID: c.ID, PodNamespace: c.Labels["io.skiff.pod.namespace"], PodName: c.Labels["io.skiff.pod.name"],
				Kind: c.Labels["io.skiff.container.kind"],
			})
		}
	}
	return out, nil
}

// bundleRunning reads the running tasks from the runtime's bundle directories: one per task, named after the
// container (<pod UID>-sandbox, <pod UID>-<kind>-<name>-<attempt>), holding the OCI spec (its hostname is the
// pod's) and the shim's init.pid. A missing directory holds no task.
func bundleRunning(dir string) ([]RunningContainer, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []RunningContainer
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		pidData, err := os.ReadFile(filepath.Join(dir, e.Name(), "init.pid"))
		if err != nil {
			continue // created, not started
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(pidData)))
		if err != nil || !processRuns(pid) {
			continue
		}
		var spec struct {
			Hostname string `json:"hostname"`
		}
		if data, err := os.ReadFile(filepath.Join(dir, e.Name(), "config.json")); err == nil {
			_ = json.Unmarshal(data, &spec)
		}
		out = append(out, RunningContainer{ID: e.Name(), PodName: spec.Hostname, Kind: containerKind(e.Name())})
	}
	return out, nil
}

// containerKind reads the kind from an agent's container ID: "<36-character pod UID>-<kind>...".
func containerKind(id string) string {
	const uidLen = 36
	if len(id) <= uidLen+1 || id[uidLen] != '-' {
		return ""
	}
	kind, _, _ := strings.Cut(id[uidLen+1:], "-")
	return kind
}

// processRuns is true for a live process that is not a zombie.
func processRuns(pid int) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	f := strings.Fields(string(stat[i+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// podsRunningTwice finds the pods whose app containers run on two hosts or more. A pod is named by its name,
// filtered by namespace (when known, and namespace is set) and by names (when set).
func podsRunningTwice(cs []RunningContainer, namespace string, names []string) map[string][]string {
	hosts := map[string]map[string]bool{}
	for _, c := range cs {
		if c.Kind != "app" || c.PodName == "" || namespace != "" && c.PodNamespace != "" && c.PodNamespace != namespace {
			continue
		}
		if len(names) > 0 && !slices.Contains(names, c.PodName) {
			continue
		}
		if hosts[c.PodName] == nil {
			hosts[c.PodName] = map[string]bool{}
		}
		hosts[c.PodName][c.Host] = true
	}
	out := map[string][]string{}
	for pod, hs := range hosts {
		if len(hs) > 1 {
			for h := range hs {
				out[pod] = append(out[pod], h)
			}
			slices.Sort(out[pod])
		}
	}
	return out
}

// CheckNoPodRunsTwice fails when a pod of one of podNames (every pod when empty), in any namespace, has app
// containers running on two agents at this moment. StartPodSampler watches for it over a round.
func CheckNoPodRunsTwice(ctx context.Context, local *Local, podNames []string) error {
	cs, err := RunningContainers(ctx, local)
	twice := podsRunningTwice(cs, "", podNames)
	var errs []error
	for _, pod := range slices.Sorted(maps.Keys(twice)) {
		errs = append(errs, fmt.Errorf("pod %s runs on %s at once", pod, strings.Join(twice[pod], " and ")))
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("reading the agents' containers: %w", err))
	}
	return errors.Join(errs...)
}

// PodSampler samples the agents' running containers over a round: a pod running on two agents at once may
// do so only for a moment, which a check at the end misses.
type PodSampler struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	samples    int
	failures   int
	lastErr    error
	violations map[string]*podOverlap // by pod and hosts
}

type podOverlap struct {
	pod         string
	hosts       []string
	first, last time.Time
	samples     int
}

// StartPodSampler samples every `every` until Stop or until ctx ends, looking at the pods of namespace named
// in names (every pod of namespace when names is empty; every namespace when namespace is empty).
func StartPodSampler(ctx context.Context, local *Local, namespace string, names []string, every time.Duration) *PodSampler {
	ctx, cancel := context.WithCancel(ctx)
	ps := &PodSampler{cancel: cancel, done: make(chan struct{}), violations: map[string]*podOverlap{}}
	go func() {
		defer close(ps.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			ps.sample(ctx, local, namespace, names)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return ps
}

func (ps *PodSampler) sample(ctx context.Context, local *Local, namespace string, names []string) {
	cs, err := RunningContainers(ctx, local)
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.samples++
	if err != nil {
		ps.failures++
		ps.lastErr = err
	}
	for pod, hosts := range podsRunningTwice(cs, namespace, names) {
		key := pod + "@" + strings.Join(hosts, ",")
		v := ps.violations[key]
		if v == nil {
			v = &podOverlap{pod: pod, hosts: hosts, first: now}
			ps.violations[key] = v
		}
		v.last = now
		v.samples++
	}
}

// Stop ends the sampling and fails for every pod seen running on two agents at once, with when; and when no
// sample could read every agent.
func (ps *PodSampler) Stop() error {
	ps.cancel()
	<-ps.done
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(ps.violations)) {
		v := ps.violations[key]
		errs = append(errs, fmt.Errorf("pod %s ran on %s at once, from %s to %s (%d of %d samples)", v.pod,
			strings.Join(v.hosts, " and "), v.first.Format("15:04:05.000"), v.last.Format("15:04:05.000"), v.samples, ps.samples))
	}
	if ps.samples > 0 && ps.failures == ps.samples {
		errs = append(errs, fmt.Errorf("no sample could read every agent's containers: %w", ps.lastErr))
	}
	return errors.Join(errs...)
}

// readyzWithin bounds how long CheckShutdown waits for a restarted server's /readyz.
var readyzWithin = 90 * time.Second

// CheckShutdown stops each server of the local cluster in turn with SIGTERM and fails for one still running
// `within` after it (it is then killed); it starts each again and waits for its /readyz before the next, so
// that the cluster keeps its quorum. It returns how long each server took to exit. For the end of a suite:
// it restarts every server.
func CheckShutdown(ctx context.Context, local *Local, within time.Duration) (map[string]time.Duration, error) {
	servers, err := serverClients(localcluster.ClusterKubeconfig(local.Dir))
	if err != nil {
		return nil, err
	}
	byName := map[string]serverClient{}
	for _, s := range servers {
		byName[s.name] = s
	}
	took := map[string]time.Duration{}
	var errs []error
	fail := func(err error) (map[string]time.Duration, error) { return took, errors.Join(append(errs, err)...) }
	for _, h := range slices.Clone(local.State.Hosts) {
		if h.Role != "server" {
			continue
		}
		s, ok := byName[h.Name]
		if !ok {
			return fail(fmt.Errorf("%s has no context in the cluster kubeconfig", h.Name))
		}
		start := time.Now()
		if err := local.State.Signal(h.Name, syscall.SIGTERM, within); err != nil {
			errs = append(errs, fmt.Errorf("%s did not exit within %v of SIGTERM: %w", h.Name, within, err))
			if err := local.State.Kill(h.Name); err != nil {
				return fail(fmt.Errorf("killing %s: %w", h.Name, err))
			}
		}
		took[h.Name] = time.Since(start)
		if err := local.State.Start(local.Dir, h.Name); err != nil {
			return fail(fmt.Errorf("starting %s again: %w", h.Name, err))
		}
		if err := waitReadyz(ctx, s, readyzWithin); err != nil {
			return fail(fmt.Errorf("%s did not come back: %w", h.Name, err))
		}
	}
	return took, errors.Join(errs...)
}

// waitReadyz polls a server's /readyz until it answers ok.
func waitReadyz(ctx context.Context, s serverClient, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := s.client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(rctx).Raw()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("/readyz not ok within %v: %w", within, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}
