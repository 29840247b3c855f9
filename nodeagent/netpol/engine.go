package netpol

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Commands names the programs the engine runs; empty fields mean the host's own, found on PATH. Tests point
// them at wrappers that run the real programs inside a throwaway network namespace.
type Commands struct {
	IPTables, IPTablesSave, IPTablesRestore, IPSet string
}

func (c Commands) withDefaults() Commands {
	for _, f := range []struct {
		field *string
		name  string
	}{{&c.IPTables, "iptables"}, {&c.IPTablesSave, "iptables-save"}, {&c.IPTablesRestore, "iptables-restore"}, {&c.IPSet, "ipset"}} {
		if *f.field == "" {
			*f.field = f.name
		}
	}
	return c
}

func (c Commands) run(ctx context.Context, stdin []byte, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Config is what the agent hands the engine.
type Config struct {
	ID     string // the agent's host id: chain and set names carry it
	Owner  string // proxy.OwnerComment of the agent, which holds its Claim
	Client kubernetes.Interface
	// Local tells whether a node is one of this agent's: only its pods get chains.
	Local  func(nodeName string) bool
	Logger hclog.Logger
	// Batch is how long a sync waits after the first change, so that a burst of changes is one restore.
	Batch time.Duration
	// CheckInterval is how often, with no change, the engine checks that its jump and chains are in place.
	CheckInterval time.Duration
	Commands      Commands
}

// Engine keeps the node's policy chains and sets in step with the cluster's NetworkPolicies, Pods and
// Namespaces.
type Engine struct {
	cfg Config
	ipt *iptables.IPTables

	policies, pods, namespaces cache.Indexer

	kick chan struct{}

	mu       sync.Mutex
	hints    map[types.UID]hint
	started  uint64 // syncs begun
	done     uint64 // the number of the last sync that succeeded (syncs begun after a hint include it)
	doneCh   chan struct{}
	lastFail error

	// Bookkeeping of the last successful sync; dropped on failure, so the next starts from what iptables
	// and ipset say.
	fingerprint string
	chains      []string
	sets        map[string]bool // sets known to exist with the right contents
	jumpOK      bool
}

// hint is a local pod's address the agent told before the pod's status carries it.
type hint struct{ key, ip string }

// New checks that iptables and ipset can be run. It changes nothing.
func New(cfg Config) (*Engine, error) {
	cfg.Commands = cfg.Commands.withDefaults()
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 50 * time.Millisecond
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = 30 * time.Second
	}
	if cfg.Local == nil {
		cfg.Local = func(string) bool { return false }
	}
	ipt, err := iptables.New(iptables.Path(cfg.Commands.IPTables), iptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("network policies need iptables: %w", err)
	}
	if _, err := exec.LookPath(cfg.Commands.IPSet); err != nil {
		return nil, fmt.Errorf("network policies need ipset (apt-get install ipset): %w", err)
	}
	return &Engine{cfg: cfg, ipt: ipt, kick: make(chan struct{}, 1), hints: map[types.UID]hint{},
		doneCh: make(chan struct{})}, nil
}

// Run syncs until ctx ends. The chains and sets stay when it returns: pods outlive the agent, and so must
// their isolation.
func (e *Engine) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(e.cfg.Client, 0)
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { e.requestSync() }, DeleteFunc: func(any) { e.requestSync() },
		UpdateFunc: func(old, cur any) {
			if relevant(old, cur) {
				e.requestSync()
			}
		},
	}
	podInformer := factory.Core().V1().Pods().Informer()
	// Only what policies read of a pod is kept: 150,000 pods would otherwise hold gigabytes.
	if err := podInformer.SetTransform(trimPod); err != nil {
		return err
	}
	infs := []cache.SharedIndexInformer{
		factory.Networking().V1().NetworkPolicies().Informer(), podInformer, factory.Core().V1().Namespaces().Informer(),
	}
	for _, inf := range infs {
		if _, err := inf.AddEventHandler(kick); err != nil {
			return err
		}
	}
	e.policies, e.pods, e.namespaces = infs[0].GetIndexer(), infs[1].GetIndexer(), infs[2].GetIndexer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	// Never sync from a partial view: a policy not listed yet would open its pods.
	if !cache.WaitForCacheSync(ctx.Done(), infs[0].HasSynced, infs[1].HasSynced, infs[2].HasSynced) {
		return nil
	}
	e.loop(ctx)
	return nil
}

// relevant tells whether an update can change the rules (pods update their status often).
func relevant(old, cur any) bool {
	op, ok1 := old.(*corev1.Pod)
	cp, ok2 := cur.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	return podIP(op, nil) != podIP(cp, nil) || op.Spec.NodeName != cp.Spec.NodeName ||
		!equalLabels(op.Labels, cp.Labels) || op.Status.Phase != cp.Status.Phase
}

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// trimPod keeps the fields rules are built from: names, labels, node, network, phase and container ports.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	ports := func(cs []corev1.Container) []corev1.Container {
		var out []corev1.Container
		for _, c := range cs {
			if len(c.Ports) > 0 {
				out = append(out, corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy})
			}
		}
		return out
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Labels: pod.Labels,
			ResourceVersion: pod.ResourceVersion},
		Spec: corev1.PodSpec{NodeName: pod.Spec.NodeName, HostNetwork: pod.Spec.HostNetwork,
			Containers: ports(pod.Spec.Containers), InitContainers: ports(pod.Spec.InitContainers)},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP, PodIPs: pod.Status.PodIPs},
	}, nil
}

func (e *Engine) requestSync() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// loop syncs after each change (batched for Batch), checks its jump and chains every CheckInterval, and
// retries a failed sync with a backoff from a second to a minute.
func (e *Engine) loop(ctx context.Context) {
	check := time.NewTicker(e.cfg.CheckInterval)
	defer check.Stop()
	failures := 0
	var retry <-chan time.Time
	for {
		if err := e.Sync(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			backoff := min(time.Second<<min(failures-1, 6), time.Minute)
			e.cfg.Logger.Warn("syncing network policy rules", "error", err, "retry_in", backoff)
			retry = time.After(backoff)
		} else {
			failures, retry = 0, nil
		}
		select {
		case <-ctx.Done():
			return
		case <-e.kick:
		case <-retry:
		case <-check.C:
			if e.missing(ctx) {
				e.forget()
			}
		}
		select { // gather the rest of a burst
		case <-ctx.Done():
			return
		case <-time.After(e.cfg.Batch):
		}
		select {
		case <-e.kick:
		default:
		}
	}
}

// Wired tells the engine a local pod's address before its status carries it, and, when a policy isolates the
// pod, waits (up to timeout) until its chain is in force: the agent calls it after wiring the pod's network
// and before starting its containers, so that an isolated pod never serves or connects unjudged. Until the
// engine's first sync (a restarted agent listing the cluster) it waits for that sync, since only then does it
// know the policies.
func (e *Engine) Wired(ctx context.Context, pod *corev1.Pod, ip string, timeout time.Duration) error {
	e.mu.Lock()
	e.hints[pod.UID] = hint{key: pod.Namespace + "/" + pod.Name, ip: ip}
	target := e.started + 1
	e.mu.Unlock()
	e.requestSync()
	deadline := time.After(timeout)
	wait := func(until uint64) error {
		for {
			e.mu.Lock()
			done, ch, failed := e.done, e.doneCh, e.lastFail
			e.mu.Unlock()
			if done >= until {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-deadline:
				if failed != nil {
					return fmt.Errorf("network policy rules for the pod not in force after %s: %w", timeout, failed)
				}
				return fmt.Errorf("network policy rules for the pod not in force after %s", timeout)
			case <-ch:
			}
		}
	}
	if err := wait(1); err != nil { // the informers are set and synced once a sync has succeeded
		return err
	}
	objs, _ := e.policies.ByIndex(cache.NamespaceIndex, pod.Namespace)
	var policies []*networkingv1.NetworkPolicy
	for _, o := range objs {
		policies = append(policies, o.(*networkingv1.NetworkPolicy))
	}
	if !SelectsPod(policies, pod) {
		return nil // not isolated: the sync asked for above adds it to other pods' peers
	}
	return wait(target)
}

// Forget drops a pod's address hint (its sandbox is gone).
func (e *Engine) Forget(uid types.UID) {
	e.mu.Lock()
	delete(e.hints, uid)
	e.mu.Unlock()
	e.requestSync()
}

// forget drops the bookkeeping: the next sync rewrites everything.
func (e *Engine) forget() {
	e.fingerprint, e.chains, e.sets, e.jumpOK = "", nil, nil, false
}

// Sync writes the rules for what the informers hold now:
//  1. build the rule set; skip the rest when it equals the last one written;
//  2. create the sets it names that do not exist (ipset restore);
//  3. restore the chains in one transaction and make sure FORWARD jumps to them;
//  4. destroy the agent's sets no rule names any more.
func (e *Engine) Sync(ctx context.Context) error {
	e.mu.Lock()
	e.started++
	number := e.started
	hints := make(map[types.UID]string, len(e.hints))
	for uid, h := range e.hints {
		hints[uid] = h.ip
	}
	e.mu.Unlock()
	err := e.sync(ctx, hints)
	e.mu.Lock()
	if err == nil {
		e.done = number
		// A hint is needed only until the pod's status carries its address.
		for uid, h := range e.hints {
			if obj, ok, _ := e.pods.GetByKey(h.key); ok && podIP(obj.(*corev1.Pod), nil) != "" {
				delete(e.hints, uid)
			}
		}
	}
	e.lastFail = err
	close(e.doneCh)
	e.doneCh = make(chan struct{})
	e.mu.Unlock()
	if err != nil {
		e.forget()
	}
	return err
}

func (e *Engine) sync(ctx context.Context, hints map[types.UID]string) error {
	if e.chains == nil {
		existing, err := e.ownChains(ctx)
		if err != nil {
			return err
		}
		e.chains = existing
	}
	in := Input{ID: e.cfg.ID, Owner: e.cfg.Owner, Hints: hints, Existing: e.chains,
		Policies:   listAs[*networkingv1.NetworkPolicy](e.policies),
		Pods:       listAs[*corev1.Pod](e.pods),
		Namespaces: listAs[*corev1.Namespace](e.namespaces),
		Local:      func(p *corev1.Pod) bool { return e.cfg.Local(p.Spec.NodeName) },
	}
	rs := Build(in)
	if rs.Fingerprint == e.fingerprint && (e.jumpOK || rs.Isolated == 0) {
		return nil
	}
	if rs.Isolated == 0 {
		// No pod of the node is isolated: the node keeps no chain, jump or set at all.
		return e.removeAll(ctx, rs.Fingerprint)
	}
	if e.sets == nil {
		present, err := e.ownSets(ctx)
		if err != nil {
			return err
		}
		e.sets = present
	}
	if script := createSets(rs.Sets, e.sets); script != "" {
		if err := e.cfg.Commands.run(ctx, []byte(script), e.cfg.Commands.IPSet, "restore", "-exist"); err != nil {
			return err
		}
		for _, s := range rs.Sets {
			e.sets[s.Name] = true
		}
	}
	if err := e.cfg.Commands.run(ctx, rs.Restore, e.cfg.Commands.IPTablesRestore, "--noflush", "-w", "5"); err != nil {
		return err
	}
	e.chains, e.fingerprint = rs.Chains, rs.Fingerprint
	if !e.jumpOK {
		if err := e.ensureJump(); err != nil {
			return err
		}
		e.jumpOK = true
	}
	wanted := map[string]bool{}
	for _, s := range rs.Sets {
		wanted[s.Name] = true
	}
	var doomed []string
	for name := range e.sets {
		if !wanted[name] {
			doomed = append(doomed, name)
		}
	}
	sort.Strings(doomed)
	for _, name := range doomed {
		if err := e.cfg.Commands.run(ctx, nil, e.cfg.Commands.IPSet, "destroy", name); err != nil {
			e.cfg.Logger.Debug("destroying an unused set", "set", name, "error", err)
			continue
		}
		delete(e.sets, name)
	}
	e.cfg.Logger.Debug("network policy rules synced", "isolated_pods", rs.Isolated, "sets", len(rs.Sets),
		"bytes", len(rs.Restore))
	return nil
}

// removeAll deletes the jump, the chains and the sets of the agent, when no pod of its node is isolated.
func (e *Engine) removeAll(ctx context.Context, fingerprint string) error {
	if len(e.chains) > 0 {
		spec := []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", e.cfg.Owner, "-j", ForwardChain(e.cfg.ID)}
		if err := e.ipt.DeleteIfExists("filter", "FORWARD", spec...); err != nil {
			return fmt.Errorf("removing the FORWARD jump: %w", err)
		}
		var b strings.Builder
		b.WriteString("*filter\n")
		for _, c := range e.chains {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		for _, c := range e.chains {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		b.WriteString("COMMIT\n")
		if err := e.cfg.Commands.run(ctx, []byte(b.String()), e.cfg.Commands.IPTablesRestore, "--noflush", "-w", "5"); err != nil {
			return err
		}
	}
	e.chains = []string{}
	if e.sets == nil || len(e.sets) > 0 {
		if err := RemoveSets(ctx, e.cfg.Commands, func(id string) bool { return id == e.cfg.ID }); err != nil {
			return err
		}
	}
	e.sets, e.fingerprint, e.jumpOK = map[string]bool{}, fingerprint, false
	return nil
}

// createSets is the ipset restore input that creates the sets not known to exist: each is made (or emptied,
// when a previous run left it half made) and filled. Sets are named after their contents, so a set that
// exists with its name has them.
func createSets(sets []Set, known map[string]bool) string {
	var b strings.Builder
	for _, s := range sets {
		if known[s.Name] {
			continue
		}
		maxelem := max(65536, 2*len(s.Entries))
		fmt.Fprintf(&b, "create %s %s family inet maxelem %d\n", s.Name, s.Type, maxelem)
		fmt.Fprintf(&b, "flush %s\n", s.Name)
		for _, entry := range s.Entries {
			fmt.Fprintf(&b, "add %s %s\n", s.Name, entry)
		}
	}
	return b.String()
}

// ensureJump puts the jump to the agent's chain first in FORWARD, for new connections, unless it is there.
func (e *Engine) ensureJump() error {
	spec := []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", e.cfg.Owner, "-j", ForwardChain(e.cfg.ID)}
	ok, err := e.ipt.Exists("filter", "FORWARD", spec...)
	if err != nil {
		return fmt.Errorf("checking the FORWARD jump: %w", err)
	}
	if !ok {
		if err := e.ipt.Insert("filter", "FORWARD", 1, spec...); err != nil {
			return fmt.Errorf("adding the FORWARD jump: %w", err)
		}
	}
	return nil
}

// missing tells whether the jump or one of the chains the last sync wrote is gone.
func (e *Engine) missing(ctx context.Context) bool {
	if e.chains == nil {
		return true
	}
	if len(e.chains) == 0 {
		return false // nothing isolated: nothing to be missing
	}
	now, err := e.ownChains(ctx)
	if err != nil {
		return true
	}
	present := map[string]bool{}
	for _, c := range now {
		present[c] = true
	}
	for _, c := range e.chains {
		if !present[c] {
			return true
		}
	}
	spec := []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", e.cfg.Owner, "-j", ForwardChain(e.cfg.ID)}
	ok, err := e.ipt.Exists("filter", "FORWARD", spec...)
	return err != nil || !ok
}

// ownChains lists the agent's chains in the filter table.
func (e *Engine) ownChains(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, e.cfg.Commands.IPTablesSave, "-t", "filter").Output()
	if err != nil {
		return nil, fmt.Errorf("iptables-save -t filter: %w", err)
	}
	chains := []string{}
	for _, line := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(line, ":"+Prefix(e.cfg.ID)); ok {
			name, _, _ = strings.Cut(name, " ")
			chains = append(chains, Prefix(e.cfg.ID)+name)
		}
	}
	return chains, nil
}

// ownSets lists the agent's sets.
func (e *Engine) ownSets(ctx context.Context) (map[string]bool, error) {
	names, err := listSets(ctx, e.cfg.Commands)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, n := range names {
		if strings.HasPrefix(n, Prefix(e.cfg.ID)) {
			out[n] = true
		}
	}
	return out, nil
}

func listSets(ctx context.Context, cmds Commands) ([]string, error) {
	out, err := exec.CommandContext(ctx, cmds.IPSet, "list", "-n").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return nil, fmt.Errorf("ipset list -n: %v: %s", err, strings.TrimSpace(string(exit.Stderr)))
		}
		return nil, fmt.Errorf("ipset list -n: %w", err)
	}
	return strings.Fields(string(out)), nil
}

// RemoveSets destroys the sets of every agent whose id doomed picks. Their chains must be gone first (the
// proxy's RemoveStale and RemoveAll remove them with the agent's other chains): a set a rule names cannot be
// destroyed. A host without ipset has none.
func RemoveSets(ctx context.Context, cmds Commands, doomed func(id string) bool) error {
	cmds = cmds.withDefaults()
	if _, err := exec.LookPath(cmds.IPSet); err != nil {
		return nil
	}
	names, err := listSets(ctx, cmds)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, namePrefix)
		if !ok || len(rest) < 9 || rest[8] != '-' || !doomed(rest[:8]) {
			continue
		}
		if err := cmds.run(ctx, nil, cmds.IPSet, "destroy", n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func listAs[T any](idx cache.Indexer) []T {
	if idx == nil {
		return nil
	}
	objs := idx.List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
