package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/localcluster"
)

// Faults is every fault the injector knows, in a fixed order so that a seed replays a round.
//
// An Inject that fails has undone what it did, as far as it could, and returns no heal. A heal has two
// parts. First it undoes the fault: restarts, SIGCONT, iptables rules, qdiscs, none of which needs the
// context, so that a heal called with a cancelled context still leaves the cluster whole. Then it waits, for
// healTimeout at most, until every host the fault touched serves again (WaitReady) — but only once no other
// fault injected into the cluster is still in force: of faults injected together, the last one healed waits
// for the hosts of all of them (a restarted agent cannot be Ready while every server is still down). A heal
// may be called again after an error, and does nothing more once it has succeeded.
var Faults = []Fault{
	{Name: "kill-leader", Inject: killLeader},
	{Name: "kill-server", Inject: killServer},
	{Name: "kill-agent", Inject: killAgent},
	{Name: "pause-leader", Inject: pauseLeader},
	{Name: "partition-leader", Inject: partitionLeader},
	{Name: "partition-minority", Inject: partitionMinority},
	{Name: "partition-agents", Inject: partitionAgents},
	{Name: "partition-oneway", Inject: partitionOneWay},
	{Name: "netem", Inject: netem},
	{Name: "interrupted-transfer", Alone: true, Inject: interruptedTransfer},
	{Name: "snapshot-install", Alone: true, Inject: snapshotInstall},
	{Name: "full-crash", Alone: true, Inject: fullCrash},
	{Name: "disk-full", Alone: true, Inject: diskFull},
	{Name: "rolling-restart", Alone: true, Inject: rollingRestart},
}

// FaultByName finds a fault of Faults.
func FaultByName(name string) (Fault, bool) {
	for _, f := range Faults {
		if f.Name == name {
			return f, true
		}
	}
	return Fault{}, false
}

const (
	// leaderTimeout bounds the search for the leader a fault targets.
	leaderTimeout = 30 * time.Second
	// healTimeout bounds a heal's wait for the hosts it touched.
	healTimeout = 2 * time.Minute
	// minHold is how long the faults that must outlast an election (pause-leader, interrupted-transfer) last
	// at least, whenever their heal is called.
	minHold = 3 * time.Second
	// snapshotBudget bounds snapshot-install's wait for the leader to truncate its log past the follower.
	snapshotBudget = 4 * time.Minute
)

type healFunc = func(context.Context) error

// faultGroup is what a cluster's heals share: how many faults are in force, and the waits of those
// healed while others were not.
type faultGroup struct {
	mu     sync.Mutex
	active int
	waits  []healFunc
}

var (
	groupsMu sync.Mutex
	groups   = map[*Local]*faultGroup{}
)

// heal makes an injected fault's heal from its undo and its wait (nil for none); see Faults.
func (l *Local) heal(undo, wait healFunc) healFunc {
	groupsMu.Lock()
	g := groups[l]
	if g == nil {
		g = &faultGroup{}
		groups[l] = g
	}
	groupsMu.Unlock()
	g.mu.Lock()
	g.active++
	g.mu.Unlock()
	var mu sync.Mutex
	undone := false
	return func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if !undone {
			if err := undo(ctx); err != nil {
				return err
			}
			undone = true
			g.mu.Lock()
			g.active--
			if wait != nil {
				g.waits = append(g.waits, wait)
			}
			g.mu.Unlock()
		}
		return g.settle(ctx)
	}
}

// settle runs the pending waits once no fault is in force; a wait that fails stays pending.
func (g *faultGroup) settle(ctx context.Context) error {
	g.mu.Lock()
	if g.active > 0 {
		g.mu.Unlock()
		return nil
	}
	waits := g.waits
	g.waits = nil
	g.mu.Unlock()
	var failed []healFunc
	var errs []error
	for _, w := range waits {
		if err := w(ctx); err != nil {
			failed, errs = append(failed, w), append(errs, err)
		}
	}
	g.mu.Lock()
	g.waits = append(failed, g.waits...)
	g.mu.Unlock()
	return errors.Join(errs...)
}

func killLeader(ctx context.Context, l *Local, _ *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	leader, err := l.leader(ctx)
	if err != nil {
		return nil, err
	}
	return l.kill(logf, leader)
}

func killServer(_ context.Context, l *Local, rng *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	return l.kill(logf, pick(rng, l.names("server")))
}

func killAgent(_ context.Context, l *Local, rng *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	return l.kill(logf, pick(rng, l.names("agent")))
}

func fullCrash(_ context.Context, l *Local, _ *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	return l.kill(logf, l.names("server")...)
}

// rollingRestart restarts every server in turn as an upgrade does: gracefully (SIGTERM), the leader last,
// each once the cluster is healthy again (`skiff operator health`). It is over when Inject returns; the
// round's traffic runs through it, so the checks cover what clients saw.
func rollingRestart(ctx context.Context, l *Local, _ *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	leader, err := l.leader(ctx)
	if err != nil {
		return nil, err
	}
	var order []string
	for _, name := range l.names("server") {
		if name != leader {
			order = append(order, name)
		}
	}
	order = append(order, leader)
	for _, name := range order {
		if err := l.waitHealthy(ctx); err != nil {
			return nil, fmt.Errorf("before restarting %s: %w", name, err)
		}
		stopped := time.Now()
		if err := l.State.Stop(name, 30*time.Second); err != nil {
			return nil, errors.Join(fmt.Errorf("stopping %s: %w", name, err), l.start(name))
		}
		if err := l.start(name); err != nil {
			return nil, err
		}
		if err := l.waitReady(ctx, name); err != nil {
			return nil, err
		}
		logf("restarted %s (SIGTERM) and it served again after %v", name, time.Since(stopped).Round(time.Millisecond))
	}
	return l.heal(func(context.Context) error { return nil }, l.waitHealthy), nil
}

// waitHealthy waits until a server reports the cluster healthy: a leader, every voter healthy, no agent dead.
func (l *Local) waitHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, healTimeout)
	defer cancel()
	var last error
	for {
		for _, server := range l.names("server") {
			var h struct {
				Healthy bool `json:"healthy"`
			}
			if err := l.getJSON(ctx, server, "/v1/operator/health", &h); err != nil {
				last = err
			} else if !h.Healthy {
				last = errors.New("the cluster is not healthy")
			} else {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the cluster to be healthy: %v", last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL to the hosts at once; the heal starts them again.
func (l *Local) kill(logf func(string, ...any), names ...string) (healFunc, error) {
	undo := func(context.Context) error { return l.start(names...) }
	if err := l.State.KillAll(names...); err != nil {
		return nil, errors.Join(err, undo(context.Background()))
	}
	logf("kill -9 %s", strings.Join(names, ", "))
	return l.heal(undo, l.waiter(names...)), nil
}

// pauseLeader stops the leader with SIGSTOP for longer than an election takes (its config's election and
// heartbeat timeouts, times six, 3 s at least, plus up to 2 s): the others elect a leader, and the old one,
// continued, finds itself deposed with writes it may still think it is committing.
func pauseLeader(ctx context.Context, l *Local, rng *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	leader, err := l.leader(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := l.serverConfig(leader)
	if err != nil {
		return nil, err
	}
	hold := max(minHold, 6*max(cfg.ElectionTimeout, cfg.HeartbeatTimeout)) + time.Duration(rng.Int64N(int64(2*time.Second)))
	if err := l.State.Pause(leader); err != nil {
		return nil, errors.Join(err, l.State.Resume(leader))
	}
	paused := time.Now()
	logf("SIGSTOP %s (the leader) for %v at least (election timeout %v)", leader, hold.Round(time.Millisecond), cfg.ElectionTimeout)
	return l.heal(func(ctx context.Context) error {
		sleepUntil(ctx, paused.Add(hold))
		return l.State.Resume(leader)
	}, l.waiter(leader)), nil
}

// partitionLeader cuts the leader off from every other host, servers and agents, both ways.
func partitionLeader(ctx context.Context, l *Local, _ *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	leader, err := l.leader(ctx)
	if err != nil {
		return nil, err
	}
	return l.isolate(logf, leader+" (the leader) from every other host", map[string][]string{leader: l.ips("", leader)})
}

// partitionMinority cuts a follower off from every other host, both ways.
func partitionMinority(ctx context.Context, l *Local, rng *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	leader, err := l.leader(ctx)
	if err != nil {
		return nil, err
	}
	follower := pick(rng, l.followers(leader))
	return l.isolate(logf, follower+" (a follower) from every other host", map[string][]string{follower: l.ips("", follower)})
}

// partitionAgents cuts every agent off from every server, both ways; the agents still reach each other.
func partitionAgents(_ context.Context, l *Local, _ *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	cuts := map[string][]string{}
	for _, a := range l.names("agent") {
		cuts[a] = l.ips("server", "")
	}
	return l.isolate(logf, "the agents from the servers", cuts)
}

// isolate adds Partition's rules, host by host; the heal removes them.
func (l *Local) isolate(logf func(string, ...any), what string, cuts map[string][]string) (healFunc, error) {
	var hosts []string
	for name := range cuts {
		hosts = append(hosts, name)
	}
	undo := func(context.Context) error {
		var errs []error
		for name, from := range cuts {
			errs = append(errs, l.State.Unpartition(name, from))
		}
		return errors.Join(errs...)
	}
	for name, from := range cuts {
		if err := l.State.Partition(name, from); err != nil {
			return nil, errors.Join(err, undo(context.Background()))
		}
	}
	logf("partition %s", what)
	return l.heal(undo, l.waiter(hosts...)), nil
}

// partitionOneWay drops, in a random server's namespace, every packet from the other servers, while its own
// still go out.
func partitionOneWay(ctx context.Context, l *Local, rng *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	leader, err := l.leader(ctx)
	if err != nil {
		return nil, err
	}
	target := pick(rng, l.names("server"))
	from := l.ips("server", target)
	undo := func(context.Context) error { return l.State.UndropInbound(target, from) }
	if err := l.State.DropInbound(target, from); err != nil {
		return nil, errors.Join(err, undo(context.Background()))
	}
	role := "a follower"
	if target == leader {
		role = "the leader"
	}
	logf("drop what %s (%s) receives from the other servers; what it sends goes out", target, role)
	return l.heal(undo, l.waiter(target)), nil
}

// netemArgs is the delay and loss of the netem fault, on every packet every host sends; netemLoss is the
// loss alone, for a kernel without netem.
var netemArgs = []string{"delay", "75ms", "50ms", "loss", "20%"}

const netemLoss = 0.2

// netem delays (75 ms, +-50 ms, so reordered) and drops (20%) every packet every host sends, on its eth0. On
// a kernel without netem (sch_netem) it drops 20% of the packets every host receives with iptables, with no
// delay, and says so.
func netem(_ context.Context, l *Local, _ *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	if _, err := exec.LookPath("tc"); err != nil {
		return nil, fmt.Errorf("netem needs tc (iproute2): %w", err)
	}
	var all []string
	for _, h := range l.State.Hosts {
		all = append(all, h.Name)
	}
	undo := func(context.Context) error {
		var errs []error
		for _, name := range all {
			errs = append(errs, l.State.ClearNetem(name), l.State.ClearLoss(name))
		}
		return errors.Join(errs...)
	}
	lossOnly := false
	for _, name := range all {
		var err error
		if lossOnly {
			err = l.State.Loss(name, netemLoss)
		} else if err = l.State.Netem(name, netemArgs...); errors.Is(err, localcluster.ErrNoNetem) && name == all[0] {
			lossOnly = true
			err = l.State.Loss(name, netemLoss)
		}
		if err != nil {
			return nil, errors.Join(err, undo(context.Background()))
		}
	}
	if lossOnly {
		logf("this kernel has no netem: %.0f%% loss into every host's eth0 (iptables statistic), no delay", netemLoss*100)
	} else {
		logf("netem %s on every host's eth0", strings.Join(netemArgs, " "))
	}
	return l.heal(undo, l.waiter(all...)), nil
}

// interruptedTransfer asks the leader to hand leadership to a follower and breaks the transfer off, in one of
// three ways the rng picks:
//   - race: the target is cut off from the leader 0-20 ms after the request, the transfer under way or done;
//   - cut-first: the target is cut off from the leader first, so that the leader cannot catch it up and must
//     give the transfer up after an election timeout and take writes again;
//   - stepdown: as cut-first, and then, within half an election timeout, the leader is cut off from every
//     other host too, so that it steps down in the middle of the transfer (hashicorp/raft#696: the transfer
//     can then stay "in progress" for good, and the old leader, elected again, refuse every write).
//
// The heal comes minHold after the cut at the earliest and reports how the transfer request ended. Its wait
// makes the old leader lead again (a transfer back) and write through it: a leader stuck in a transfer
// fails there.
func interruptedTransfer(ctx context.Context, l *Local, rng *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	leader, err := l.leader(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := l.serverConfig(leader)
	if err != nil {
		return nil, err
	}
	target := pick(rng, l.followers(leader))
	variant := pick(rng, []string{"race", "cut-first", "stepdown"})
	cuts := map[string][]string{target: {l.ip(leader)}}
	undo := func(context.Context) error {
		var errs []error
		for name, from := range cuts {
			errs = append(errs, l.State.Unpartition(name, from))
		}
		return errors.Join(errs...)
	}
	type answer struct {
		err  error
		took time.Duration
	}
	done := make(chan answer, 1)
	transfer := func() {
		tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		asked := time.Now()
		go func() {
			defer cancel()
			err := l.transferLeadership(tctx, leader, target)
			done <- answer{err, time.Since(asked)}
		}()
	}
	var delay time.Duration
	switch variant {
	case "race":
		delay = time.Duration(rng.Int64N(int64(20 * time.Millisecond)))
		transfer()
		time.Sleep(delay)
		err = l.State.Partition(target, cuts[target])
	case "cut-first", "stepdown":
		if err = l.State.Partition(target, cuts[target]); err != nil {
			break
		}
		transfer()
		if variant == "stepdown" {
			delay = time.Duration(rng.Int64N(int64(cfg.ElectionTimeout/2) + 1))
			time.Sleep(delay)
			cuts[leader] = l.ips("", leader)
			err = l.State.Partition(leader, cuts[leader])
		}
	}
	if err != nil {
		return nil, errors.Join(err, undo(context.Background()))
	}
	cut := time.Now()
	switch variant {
	case "race":
		logf("race: transfer leadership %s -> %s, and cut %s off from %s %v later", leader, target, target, leader, delay.Round(100*time.Microsecond))
	case "cut-first":
		logf("cut-first: cut %s off from %s, then transfer leadership %s -> %s", target, leader, leader, target)
	case "stepdown":
		logf("stepdown: cut %s off from %s, transfer leadership %s -> %s, and %v later cut %s off from every host", target, leader, leader, target, delay.Round(time.Millisecond), leader)
	}
	reported := false
	return l.heal(func(ctx context.Context) error {
		sleepUntil(ctx, cut.Add(minHold))
		return undo(ctx)
	}, func(ctx context.Context) error {
		if !reported {
			select {
			case a := <-done:
				reported = true
				logf("the transfer request answered after %v: %v", a.took.Round(time.Millisecond), orOK(a.err))
			case <-ctx.Done():
			}
		}
		if err := l.waitReady(ctx, l.names("server")...); err != nil {
			return err
		}
		return l.leadAgain(ctx, leader, logf)
	}), nil
}

// leadAgain makes a server the leader again (transfers to it from whichever leads) and waits until a write
// through it succeeds: a leader that lost its leadership in the middle of a transfer must not come back
// refusing writes (hashicorp/raft#696).
func (l *Local) leadAgain(ctx context.Context, server string, logf func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, healTimeout)
	defer cancel()
	start := time.Now()
	var leadingSince time.Time
	var last error
	for {
		cur, err := l.Leader(ctx)
		switch {
		case err != nil:
			last = err
		case cur != server:
			leadingSince = time.Time{}
			if err := l.transferLeadership(ctx, cur, server); err != nil {
				last = fmt.Errorf("transferring leadership %s -> %s: %w", cur, server, err)
			}
		default:
			if leadingSince.IsZero() {
				leadingSince = time.Now()
			}
			if last = l.probeWrite(ctx, server); last == nil {
				logf("%s leads again and takes writes, %v after the heal", server, time.Since(start).Round(10*time.Millisecond))
				return nil
			}
			if time.Since(leadingSince) > 20*time.Second {
				return fmt.Errorf("%s has led for %v and refuses writes (a leadership transfer stuck in progress? hashicorp/raft#696): %w",
					server, time.Since(leadingSince).Round(time.Second), last)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s does not lead and take writes again: %w (%v)", server, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// probeWrite writes through a server: a ConfigMap created and deleted in chaos-snap.
func (l *Local) probeWrite(ctx context.Context, server string) error {
	cfg, err := l.restConfig(server)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := ensureNamespace(ctx, client, burstNamespace); err != nil {
		return err
	}
	cms := client.CoreV1().ConfigMaps(burstNamespace)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	return cms.Delete(ctx, cm.Name, metav1.DeleteOptions{})
}

func ensureNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// snapshotInstall cuts a follower off and writes (ConfigMaps created and deleted in the namespace
// chaos-snap, beside whatever traffic runs) until the leader has taken a snapshot and truncated its log past
// the follower's last entry, so that the follower can only catch up by installing the snapshot. The heal
// reconnects it under the same write load (hashicorp/raft#697) and waits until it has installed it.
//
// With the default server.raft settings (snapshot_threshold 8192, trailing_logs 10240, snapshot_interval
// 30s) that takes over 10240 writes and up to a minute of waiting for the snapshot timer.
func snapshotInstall(ctx context.Context, l *Local, rng *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	leader, err := l.leader(ctx)
	if err != nil {
		return nil, err
	}
	follower := pick(rng, l.followers(leader))
	cfg, err := l.serverConfig(leader)
	if err != nil {
		return nil, err
	}
	others := l.ips("", follower)
	unpartition := func() error { return l.State.Unpartition(follower, others) }
	if err := l.State.Partition(follower, others); err != nil {
		return nil, errors.Join(err, unpartition())
	}
	cut := time.Now()
	// Nothing reaches the follower now: its last index stays put.
	last, err := l.raftIndex(ctx, follower, "last")
	if err != nil {
		return nil, errors.Join(err, unpartition())
	}
	need := last + cfg.TrailingLogs
	logf("cut %s (a follower) off at index %d; writing until the leader's snapshot passes index %d (trailing_logs %d, snapshot_threshold %d, snapshot_interval %v)",
		follower, last, need, cfg.TrailingLogs, cfg.SnapshotThreshold, cfg.SnapshotInterval)
	wctx, cancel := context.WithTimeout(ctx, snapshotBudget)
	defer cancel()
	b, err := l.startBurst(wctx, leader)
	if err != nil {
		return nil, errors.Join(err, unpartition())
	}
	snap := uint64(0)
	for {
		// The current leader's snapshot counts: leadership may move while the follower is away.
		if cur, err := l.Leader(wctx); err == nil {
			leader = cur
		}
		if snap, _ = snapshotIndex(l.Dir, leader); snap > need {
			break
		}
		select {
		case <-wctx.Done():
			writes := b.stop()
			return nil, errors.Join(fmt.Errorf("%s's snapshot is at index %d, not past %d, after %d writes in %v: lower server.raft.trailing_logs and snapshot_threshold (and snapshot_interval) in the servers' HCL",
				leader, snap, need, writes, time.Since(cut).Round(time.Second)), unpartition())
		case <-time.After(500 * time.Millisecond):
		}
	}
	logf("%s snapshotted at index %d, past %s's %d, after %d writes in %v", leader, snap, follower, last, b.stop(), time.Since(cut).Round(100*time.Millisecond))
	// The heal reconnects the follower under write load, which runs until the follower has installed the
	// snapshot (or healTimeout).
	var load *burst
	var healed time.Time
	return l.heal(func(context.Context) error {
		if load == nil {
			bctx, cancel := context.WithTimeout(context.Background(), healTimeout)
			var err error
			if load, err = l.startBurst(bctx, leader); err != nil {
				cancel()
				logf("no write load for the heal: %v", err)
			} else {
				context.AfterFunc(bctx, cancel)
			}
		}
		healed = time.Now()
		return unpartition()
	}, func(ctx context.Context) error {
		if load != nil {
			defer func() { logf("%d writes during the heal", load.stop()) }()
		}
		ctx, cancel := context.WithTimeout(ctx, healTimeout)
		defer cancel()
		for {
			installed, err := snapshotIndex(l.Dir, follower)
			if err == nil && installed >= snap {
				logf("%s installed a snapshot at index %d %v after the heal", follower, installed, time.Since(healed).Round(100*time.Millisecond))
				return l.WaitReady(ctx, follower)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s has not installed the leader's snapshot (index %d) %v after the heal (its own is at %d, %v)",
					follower, snap, time.Since(healed).Round(time.Second), installed, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}), nil
}

// diskFull fills a random server's data dir. The first time, the server is stopped, its data dir moved onto
// a loop-mounted filesystem of its own (localcluster.MoveDataDirToLoop: the data plus 64 MiB) and started
// again; the filesystem stays until localcluster.CleanupFaults. The heal removes the filler, and starts the
// server again if the full disk stopped it.
func diskFull(ctx context.Context, l *Local, rng *rand.Rand, logf func(string, ...any)) (healFunc, error) {
	target := pick(rng, l.names("server"))
	data := localcluster.DataDir(l.Dir, target)
	undo := func(context.Context) error {
		return errors.Join(localcluster.RemoveFiller(data), l.start(target))
	}
	mounted, err := localcluster.DataDirMounted(l.Dir, target)
	if err != nil {
		return nil, err
	}
	if !mounted {
		start := time.Now()
		if err := l.State.Stop(target, 10*time.Second); err != nil {
			return nil, errors.Join(err, undo(context.Background()))
		}
		if err := l.State.MoveDataDirToLoop(l.Dir, target, 64<<20); err != nil {
			return nil, errors.Join(err, undo(context.Background()))
		}
		if err := errors.Join(undo(context.Background()), l.waitReady(ctx, target)); err != nil {
			return nil, err
		}
		logf("moved %s's data dir onto a loop filesystem (a restart, %v)", target, time.Since(start).Round(100*time.Millisecond))
	}
	_, grown, err := localcluster.FillDisk(data)
	if err != nil {
		return nil, errors.Join(err, undo(context.Background()))
	}
	var st syscall.Statfs_t
	_ = syscall.Statfs(data, &st)
	logf("filled %s's data dir with %d MiB: %d KiB left", target, grown>>20, int64(st.Bavail)*st.Bsize>>10)
	return l.heal(undo, l.waiter(target)), nil
}

// Leader is the host name of the current Raft leader: the server that a majority of the servers name as the
// leader in their lists of Raft peers. It waits for one until ctx ends.
func (l *Local) Leader(ctx context.Context) (string, error) {
	servers := l.names("server")
	var last error
	for {
		leaders := make([]string, len(servers))
		errs := make([]error, len(servers))
		var wg sync.WaitGroup
		for i, s := range servers {
			wg.Go(func() { leaders[i], errs[i] = l.leaderSeenBy(ctx, s) })
		}
		wg.Wait()
		votes := map[string]int{}
		for _, name := range leaders {
			// Survivors go on naming a leader that was just killed or paused until they time out; a fault
			// that targets the leader must find the live one.
			if name != "" && l.State.Running(name) && !l.State.Paused(name) {
				if votes[name]++; votes[name] > len(servers)/2 {
					return name, nil
				}
			}
		}
		last = fmt.Errorf("leaders seen: %v, errors: %v", leaders, errors.Join(errs...))
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no Raft leader a majority of servers agrees on: %w (%v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// leader is Leader, waiting for leaderTimeout at most.
func (l *Local) leader(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, leaderTimeout)
	defer cancel()
	return l.Leader(ctx)
}

// leaderSeenBy is the leader in a server's list of Raft peers ("" for none).
func (l *Local) leaderSeenBy(ctx context.Context, server string) (string, error) {
	var peers []struct{ Name, State string }
	if err := l.getJSON(ctx, server, "/v1/operator/raft/peers", &peers); err != nil {
		return "", err
	}
	for _, p := range peers {
		if p.State == "leader" {
			return p.Name, nil
		}
	}
	return "", nil
}

// WaitReady waits until a host serves again: a server's API answers /readyz (it knows a leader and has
// applied all it committed); an agent's Node is Ready and the agent alive in the gossip pool, as a server
// sees them. It fails at once when the host's process is not running or is paused.
func (l *Local) WaitReady(ctx context.Context, name string) error {
	h, ok := l.State.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	check := l.serverReady
	if h.Role == "agent" {
		check = l.agentReady
	}
	for {
		switch {
		case !l.State.Running(name):
			return fmt.Errorf("%s is not running; its log ends:\n%s", name, logTail(h.Log, 2000))
		case l.State.Paused(name):
			return fmt.Errorf("%s is paused (SIGSTOP)", name)
		}
		err := check(ctx, name)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is not ready: %w (%v)", name, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitReady is WaitReady for each host, waiting for healTimeout at most.
func (l *Local) waitReady(ctx context.Context, names ...string) error {
	ctx, cancel := context.WithTimeout(ctx, healTimeout)
	defer cancel()
	for _, name := range names {
		if err := l.WaitReady(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// start starts the hosts that are not running.
func (l *Local) start(names ...string) error {
	var errs []error
	for _, name := range names {
		if _, err := l.State.StartIfStopped(l.Dir, name); err != nil {
			errs = append(errs, fmt.Errorf("starting %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// waiter is a heal's wait for the hosts to serve again.
func (l *Local) waiter(names ...string) healFunc {
	return func(ctx context.Context) error { return l.waitReady(ctx, names...) }
}

// serverReady: the server's /readyz says ok and its Kubernetes API serves a read. (The bootstrap server that
// holds a restarted server's port until its API is built says not ready; the read checks the API itself.)
func (l *Local) serverReady(ctx context.Context, name string) error {
	body, err := l.get(ctx, name, "/readyz")
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("/readyz: %q", body)
	}
	if _, err := l.get(ctx, name, "/api/v1/namespaces/default"); err != nil {
		return fmt.Errorf("the Kubernetes API: %w", err)
	}
	return nil
}

// agentReady asks the servers in turn whether an agent is alive and its Node Ready.
func (l *Local) agentReady(ctx context.Context, name string) error {
	var errs []error
	for _, s := range l.names("server") {
		err := func() error {
			var members []struct{ Name, Status string }
			if err := l.getJSON(ctx, s, "/v1/operator/members", &members); err != nil {
				return err
			}
			alive := false
			for _, m := range members {
				alive = alive || m.Name == name && m.Status == "alive"
			}
			if !alive {
				return fmt.Errorf("%s is not an alive gossip member for %s: %+v", name, s, members)
			}
			client, err := l.clientset(s)
			if err != nil {
				return err
			}
			node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status == corev1.ConditionTrue {
						return nil
					}
					return fmt.Errorf("node %s Ready=%s (%s)", name, c.Status, c.Reason)
				}
			}
			return fmt.Errorf("node %s has no Ready condition", name)
		}()
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("through %s: %w", s, err))
	}
	return errors.Join(errs...)
}

// transferLeadership asks a server (the leader) to hand leadership to another.
func (l *Local) transferLeadership(ctx context.Context, server, to string) error {
	_, err := l.do(ctx, server, http.MethodPost, "/v1/operator/raft/transfer-leadership?to="+url.QueryEscape(to))
	return err
}

// raftIndex is one of a server's Raft indexes (kind last, commit or applied), from its /metrics.
func (l *Local) raftIndex(ctx context.Context, server, kind string) (uint64, error) {
	body, err := l.get(ctx, server, "/metrics")
	if err != nil {
		return 0, err
	}
	prefix := `skiff_raft_index{kind="` + kind + `"} `
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return uint64(f), err
		}
	}
	return 0, fmt.Errorf("%s's /metrics has no %s", server, strings.TrimSpace(prefix))
}

// snapshotIndex is the index of the latest complete Raft snapshot in a server's data dir (0 for none):
// <data>/raft/snapshots/<term>-<index>-<ms>.
func snapshotIndex(dir, server string) (uint64, error) {
	entries, err := os.ReadDir(filepath.Join(localcluster.DataDir(dir, server), "raft", "snapshots"))
	if err != nil {
		return 0, err
	}
	var top uint64
	for _, e := range entries {
		parts := strings.Split(e.Name(), "-")
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") || len(parts) != 3 {
			continue
		}
		if i, err := strconv.ParseUint(parts[1], 10, 64); err == nil {
			top = max(top, i)
		}
	}
	return top, nil
}

// burst writes as fast as it can through one server: ConfigMaps created and deleted in chaos-snap.
type burst struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	writes atomic.Int64
}

const burstNamespace = "chaos-snap"

func (l *Local) startBurst(ctx context.Context, server string) (*burst, error) {
	cfg, err := l.restConfig(server)
	if err != nil {
		return nil, err
	}
	cfg.QPS = -1 // no client-side rate limit
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := ensureNamespace(ctx, client, burstNamespace); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	b := &burst{cancel: cancel}
	cms := client.CoreV1().ConfigMaps(burstNamespace)
	for w := range 16 {
		b.wg.Go(func() {
			prev := ""
			for i := 0; ctx.Err() == nil; i++ {
				name := fmt.Sprintf("w%d-%d", w, i)
				_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": strconv.Itoa(i)}}, metav1.CreateOptions{})
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				b.writes.Add(1)
				if prev != "" && cms.Delete(ctx, prev, metav1.DeleteOptions{}) == nil {
					b.writes.Add(1)
				}
				prev = name
			}
			if prev != "" {
				dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = cms.Delete(dctx, prev, metav1.DeleteOptions{})
				cancel()
			}
		})
	}
	return b, nil
}

// stop stops the writers and returns how many writes succeeded.
func (b *burst) stop() int64 {
	b.cancel()
	b.wg.Wait()
	return b.writes.Load()
}

// kubeconfig is the admin kubeconfig a server wrote into its data dir.
func (l *Local) kubeconfig(server string) string {
	return filepath.Join(localcluster.DataDir(l.Dir, server), "admin.kubeconfig")
}

func (l *Local) restConfig(server string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", l.kubeconfig(server))
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	return cfg, nil
}

func (l *Local) clientset(server string) (*kubernetes.Clientset, error) {
	cfg, err := l.restConfig(server)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// do sends a request to a server's API with its admin credentials, and returns the body of a 2xx answer.
func (l *Local) do(ctx context.Context, server, method, path string) ([]byte, error) {
	cfg, err := l.restConfig(server)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(cfg.Host, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s on %s: HTTP %d: %s", method, path, server, resp.StatusCode, bytes.TrimSpace(body))
	}
	return body, nil
}

func (l *Local) get(ctx context.Context, server, path string) ([]byte, error) {
	return l.do(ctx, server, http.MethodGet, path)
}

func (l *Local) getJSON(ctx context.Context, server, path string, out any) error {
	body, err := l.get(ctx, server, path)
	if err != nil {
		return err
	}
	return json.Unmarshal(body, out)
}

// serverConfig is a server's configuration, as it reads it (its HCL over the defaults).
func (l *Local) serverConfig(server string) (*config.Server, error) {
	h, ok := l.State.Host(server)
	if !ok {
		return nil, fmt.Errorf("no host %s", server)
	}
	return config.LoadServer(h.Config, nil)
}

// names are the hosts of a role, in the cluster's order.
func (l *Local) names(role string) []string {
	var out []string
	for _, h := range l.State.Hosts {
		if h.Role == role {
			out = append(out, h.Name)
		}
	}
	return out
}

// followers are the servers other than the leader.
func (l *Local) followers(leader string) []string {
	var out []string
	for _, s := range l.names("server") {
		if s != leader {
			out = append(out, s)
		}
	}
	return out
}

// ips are the addresses of the hosts of a role ("" for all) other than except.
func (l *Local) ips(role, except string) []string {
	var out []string
	for _, h := range l.State.Hosts {
		if (role == "" || h.Role == role) && h.Name != except {
			out = append(out, h.IP)
		}
	}
	return out
}

// ip is a host's address.
func (l *Local) ip(name string) string {
	if h, ok := l.State.Host(name); ok {
		return h.IP
	}
	return ""
}

func pick(rng *rand.Rand, names []string) string { return names[rng.IntN(len(names))] }

// sleepUntil waits until t, or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

func orOK(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// logTail is the end of a log file.
func logTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	data, _ := io.ReadAll(f)
	return string(data)
}
