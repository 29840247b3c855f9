package proxy

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Config is what the agent hands the proxy.
type Config struct {
	NodeName string
	ID       string // the agent's host id (8 hex digits): chain names carry it
	DataDir  string // named in the owner comment; the agent holds its Claim
	// PodCIDR overrides the Node's spec.podCIDR (agent.pod_cidr), for telling local traffic from external.
	PodCIDR  string
	Client   kubernetes.Interface
	Recorder record.EventRecorder // Warning events on Services, slices and the Node; nil for none
	Logger   hclog.Logger
	// MinSyncInterval is the least time between two syncs: events within it are batched into one restore.
	MinSyncInterval time.Duration
	// FullSyncInterval is how often the proxy checks, with no event, that its jumps and chains are in place;
	// it rewrites every chain when one is missing (and always after a failed sync).
	FullSyncInterval time.Duration
	Commands         Commands
}

// Proxy programs the Services of the cluster on this node.
type Proxy struct {
	cfg      Config
	names    chainNames
	ipt      *iptables.IPTables
	owner    string
	features struct{ sctp, randomFully bool }

	services  cache.Indexer
	slices    cache.Indexer
	nodes     cache.Indexer
	kick      chan struct{}
	listeners sync.WaitGroup

	// Bookkeeping of the last successful sync; dropped on failure, so the next sync starts from what
	// iptables-save says.
	existing     map[string][]string
	fingerprint  string            // Ruleset.Fingerprint of the last successful restore
	portHash     map[string]string // Ruleset.PortHashes of the last successful restore
	jumpsOK      bool
	udp          map[udpFlow]bool
	udpServed    map[udpDest]bool
	reported     map[string]bool // problems already reported as events
	lastProblems []Problem       // the rules' problems at the last restore
	health       *healthChecks
	noConntrack  bool
	restores     int // restores attempted: the sync loop paces only syncs that wrote
}

// New checks iptables and what the kernel supports. It changes no rule.
func New(cfg Config) (*Proxy, error) {
	cfg.Commands = cfg.Commands.withDefaults()
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.MinSyncInterval <= 0 {
		cfg.MinSyncInterval = time.Second
	}
	if cfg.FullSyncInterval <= 0 {
		cfg.FullSyncInterval = 30 * time.Second
	}
	ipt, err := iptables.New(iptables.Path(cfg.Commands.IPTables), iptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("service proxy needs iptables: %w", err)
	}
	p := &Proxy{cfg: cfg, names: namesFor(cfg.ID), ipt: ipt, owner: OwnerComment(cfg.ID, cfg.DataDir),
		kick: make(chan struct{}, 1), reported: map[string]bool{}, health: newHealthChecks(cfg.NodeName, cfg.Logger)}
	if err := enableBridgeNetfilter(); err != nil {
		// Only pods reaching a Service whose endpoint is on their own node are hit; say so and go on.
		cfg.Logger.Warn("bridged traffic bypasses iptables: a pod's connection to a Service endpoint on its own node will fail", "error", err)
	}
	p.features.randomFully = ipt.HasRandomFully()
	p.features.sctp = p.probeSCTP(context.Background())
	v1, v2, v3 := ipt.GetIptablesVersion()
	cfg.Logger.Info("service proxy", "iptables", fmt.Sprintf("%d.%d.%d", v1, v2, v3),
		"random_fully", p.features.randomFully, "sctp", p.features.sctp)
	return p, nil
}

// probeSCTP tells whether SCTP ports can be matched and translated, by writing such rules in a scratch
// chain pair (nothing jumps to them) and removing them.
func (p *Proxy) probeSCTP(ctx context.Context) bool {
	chain := p.names.ownerPrefix + "PROBE"
	probe := fmt.Sprintf("*nat\n:%[1]s - [0:0]\n-A %[1]s -p sctp -m sctp --dport 1 -j DNAT --to-destination 127.0.0.1:1\nCOMMIT\n", chain)
	err := p.cfg.Commands.restore(ctx, []byte(probe))
	_ = p.ipt.ClearAndDeleteChain("nat", chain)
	if err != nil {
		p.cfg.Logger.Warn("SCTP Services will not be programmed", "error", err)
	}
	return err == nil
}

// Run syncs the rules until ctx ends, then removes the agent's service chains (not the pod egress masquerade
// chain: pods outlive the agent). Established connections survive a restart either way: conntrack keeps
// their translation, and the first sync of the next run rewrites the rules in one transaction.
func (p *Proxy) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(p.cfg.Client, 0)
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(p.cfg.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.cfg.NodeName).String()
	}))
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { p.requestSync() }, DeleteFunc: func(any) { p.requestSync() },
		UpdateFunc: func(_, _ any) { p.requestSync() },
	}
	informers := []cache.SharedIndexInformer{
		factory.Core().V1().Services().Informer(),
		factory.Discovery().V1().EndpointSlices().Informer(),
		nodeFactory.Core().V1().Nodes().Informer(),
	}
	for _, inf := range informers {
		if _, err := inf.AddEventHandler(kick); err != nil {
			return err
		}
	}
	p.services, p.slices, p.nodes = informers[0].GetIndexer(), informers[1].GetIndexer(), informers[2].GetIndexer()
	factory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())
	defer factory.Shutdown()
	defer nodeFactory.Shutdown()
	// Never sync from a partial view: that would drop the rules of Services not listed yet.
	if !cache.WaitForCacheSync(ctx.Done(), informers[0].HasSynced, informers[1].HasSynced, informers[2].HasSynced) {
		return nil // stopped before the first sync: nothing was written
	}
	defer p.health.close()
	p.loop(ctx)
	cleanup, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.Remove(cleanup)
}

// Remove deletes the agent's service chains and the jumps to them.
func (p *Proxy) Remove(ctx context.Context) error {
	return p.cfg.Commands.removeChains(ctx, func(ch string) bool { return strings.HasPrefix(ch, p.names.ownerPrefix) })
}

func (p *Proxy) requestSync() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// loop runs a sync when asked, writing at most once per MinSyncInterval on average (with a burst of two, as
// kube-proxy's BoundedFrequencyRunner allows, so that an isolated change right after another is not held
// back); a full one every FullSyncInterval; and after a failure, again after a backoff that doubles from
// MinSyncInterval to a minute.
func (p *Proxy) loop(ctx context.Context) {
	full := time.NewTicker(p.cfg.FullSyncInterval)
	defer full.Stop()
	writes := newWriteBucket(p.cfg.MinSyncInterval, time.Now())
	failures := 0
	var retry <-chan time.Time
	wantFull := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-full.C:
			// Rewriting every chain costs seconds at thousands of endpoints (iptables-nft restores about
			// 0.6 MB/s here: docs/BENCHMARKS.md), so the periodic sync rewrites everything only when a chain of the agent's went
			// missing; the jumps are checked every time.
			p.jumpsOK = false
			if missing, err := p.chainsMissing(ctx); err != nil || missing {
				wantFull = true
			}
		case <-retry:
			wantFull = true
		}
		if wait := writes.wait(time.Now()); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		select { // events that came while waiting are in this sync
		case <-p.kick:
		default:
		}
		// Only a sync that wrote counts for the pacing: one that found nothing to change (a new endpoint
		// that is not ready yet, say) must not hold back the change that follows (that pod turning Ready).
		start, restores := time.Now(), p.restores
		err := p.Sync(ctx, wantFull)
		if p.restores != restores {
			writes.take(start)
		}
		if err == nil {
			failures, retry, wantFull = 0, nil, false
			continue
		}
		if ctx.Err() != nil {
			return
		}
		failures++
		backoff := min(p.cfg.MinSyncInterval<<min(failures-1, 10), time.Minute)
		p.cfg.Logger.Warn("syncing service rules", "error", err, "retry_in", backoff)
		p.nodeEvent("FailedToSyncServiceRules", fmt.Sprintf("iptables sync failed (attempt %d, next in %s): %v", failures, backoff, err))
		retry = time.After(backoff)
	}
}

// Sync writes the rules for what the informers hold now.
//  1. Read Services, slices and the Node; on a full sync (and the first), also which of the agent's chains
//     iptables has, so that chains of Services deleted meanwhile go too.
//  2. Build the rule set, leaving out the chains of service ports unchanged since the last sync (not on a full
//     sync); skip the restore when it leads to the rules the last one left (same fingerprint).
//  3. Restore it in one transaction; make sure of the jumps from the built-in chains.
//  4. Report new problems as events, and flush conntrack entries of UDP endpoints that went away.
func (p *Proxy) Sync(ctx context.Context, full bool) error {
	services, slices := listAs[*corev1.Service](p.services), listAs[*discoveryv1.EndpointSlice](p.slices)
	facts := p.facts()
	if full || p.existing == nil {
		existing, err := p.ownChains(ctx)
		if err != nil {
			return err
		}
		facts.Existing = existing
	} else {
		facts.Existing, facts.Previous = p.existing, p.portHash
	}
	rs := BuildRules(services, slices, facts)
	healthProblems := p.health.sync(services, slices)
	if !full && p.jumpsOK && rs.Fingerprint == p.fingerprint {
		if len(healthProblems) > 0 {
			p.report(append(append([]Problem(nil), p.lastProblems...), healthProblems...))
		}
		return nil
	}
	p.restores++
	if err := p.cfg.Commands.restore(ctx, rs.Restore); err != nil {
		p.existing, p.fingerprint, p.portHash, p.jumpsOK = nil, "", nil, false
		return err
	}
	first := p.udp == nil
	p.existing, p.fingerprint, p.portHash = rs.Chains, rs.Fingerprint, rs.PortHashes
	if full || !p.jumpsOK {
		if err := ensureJumps(p.ipt, p.names, p.owner); err != nil {
			p.jumpsOK = false
			return err
		}
		p.jumpsOK = true
	}
	p.lastProblems = rs.Problems
	p.report(append(append([]Problem(nil), rs.Problems...), healthProblems...))
	if !first { // a restarted agent keeps established flows: nothing is flushed on its first sync
		p.flushConntrack(ctx, rs)
	}
	p.udp, p.udpServed = rs.UDP, rs.UDPServed
	p.cfg.Logger.Debug("service rules synced", "service_ports", rs.ServicePorts, "endpoints", rs.Endpoints,
		"service_ports_written", rs.Written, "bytes", len(rs.Restore))
	return nil
}

// chainsMissing tells whether a chain the last sync left is gone (someone flushed the table, say).
func (p *Proxy) chainsMissing(ctx context.Context) (bool, error) {
	now, err := p.ownChains(ctx)
	if err != nil {
		return true, err
	}
	for table, chains := range p.existing {
		present := map[string]bool{}
		for _, c := range now[table] {
			present[c] = true
		}
		for _, c := range chains {
			if !present[c] {
				return true, nil
			}
		}
	}
	return false, nil
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

func (p *Proxy) node() *corev1.Node {
	if p.nodes == nil {
		return nil
	}
	obj, ok, _ := p.nodes.GetByKey(p.cfg.NodeName)
	if !ok {
		return nil
	}
	return obj.(*corev1.Node)
}

func (p *Proxy) facts() NodeFacts {
	f := NodeFacts{ID: p.cfg.ID, Owner: p.owner, NodeName: p.cfg.NodeName, PodCIDR: p.cfg.PodCIDR,
		SCTP: p.features.sctp, RandomFully: p.features.randomFully}
	if node := p.node(); f.PodCIDR == "" && node != nil {
		f.PodCIDR = node.Spec.PodCIDR
	}
	return f
}

// ownChains lists the agent's service chains iptables holds now, by table.
func (p *Proxy) ownChains(ctx context.Context) (map[string][]string, error) {
	out := map[string][]string{}
	for _, table := range tables {
		saved, err := p.cfg.Commands.save(ctx, table)
		if err != nil {
			return nil, err
		}
		for _, ch := range saved.chains {
			if strings.HasPrefix(ch, p.names.ownerPrefix) {
				out[table] = append(out[table], ch)
			}
		}
	}
	return out, nil
}

// report records each problem once as a Warning event on its object; a problem that goes away and comes
// back is reported again.
func (p *Proxy) report(problems []Problem) {
	now := map[string]bool{}
	for _, pr := range problems {
		key := fmt.Sprintf("%p|%s|%s", pr.Object, pr.Reason, pr.Message)
		if m, ok := pr.Object.(metav1.Object); ok {
			key = fmt.Sprintf("%s|%s|%s", m.GetUID(), pr.Reason, pr.Message)
		}
		now[key] = true
		if p.reported[key] {
			continue
		}
		p.cfg.Logger.Warn("service proxy skipped part of an object", "reason", pr.Reason, "message", pr.Message)
		if p.cfg.Recorder != nil {
			p.cfg.Recorder.Event(pr.Object, corev1.EventTypeWarning, pr.Reason, pr.Message)
		}
	}
	p.reported = now
}

func (p *Proxy) nodeEvent(reason, message string) {
	if p.cfg.Recorder == nil {
		return
	}
	var obj = p.node()
	if obj == nil {
		obj = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: p.cfg.NodeName, UID: types.UID(p.cfg.NodeName)}}
	}
	p.cfg.Recorder.Event(obj, corev1.EventTypeWarning, reason, message)
}

// flushConntrack deletes the conntrack entries that would keep UDP traffic on a path the rules no longer
// take: flows translated to an endpoint that is gone (UDP has no connection end to drop them), and
// untranslated flows to a destination that just got its first endpoint. TCP needs none of this: a removed
// endpoint's connections fail and reconnect through the rules.
func (p *Proxy) flushConntrack(ctx context.Context, rs *Ruleset) {
	if p.noConntrack {
		return
	}
	var runs [][]string
	for flow := range p.udp {
		if !rs.UDP[flow] {
			runs = append(runs, append(flow.dest.args(), "--dst-nat", flow.endpointIP))
		}
	}
	for dest := range rs.UDPServed {
		if !p.udpServed[dest] {
			runs = append(runs, dest.args())
		}
	}
	for _, args := range runs {
		out, err := exec.CommandContext(ctx, p.cfg.Commands.Conntrack, append([]string{"-D", "-p", "udp"}, args...)...).CombinedOutput()
		if errors.Is(err, exec.ErrNotFound) {
			p.noConntrack = true
			p.cfg.Logger.Warn("conntrack is not installed; stale UDP flows to removed endpoints are not flushed")
			return
		}
		// conntrack exits 1 when nothing matched.
		if err != nil && !strings.Contains(string(out), "0 flow entries") {
			p.cfg.Logger.Warn("flushing UDP conntrack entries", "args", args, "error", err, "output", strings.TrimSpace(string(out)))
		}
	}
}

func (d udpDest) args() []string {
	if d.ip != "" {
		return []string{"--orig-dst", d.ip}
	}
	return []string{"--orig-port-dst", fmt.Sprint(d.nodePort)}
}

// writeBucket paces restores: a token bucket of writeBurst tokens that refills one per interval.
type writeBucket struct {
	interval time.Duration
	tokens   float64
	at       time.Time // when tokens was last brought up to date
}

// writeBurst is how many restores may follow each other without waiting, as kube-proxy's burstSyncs.
const writeBurst = 2

func newWriteBucket(interval time.Duration, now time.Time) *writeBucket {
	return &writeBucket{interval: interval, tokens: writeBurst, at: now}
}

func (b *writeBucket) refill(now time.Time) {
	b.tokens = min(writeBurst, b.tokens+float64(now.Sub(b.at))/float64(b.interval))
	b.at = now
}

// wait is how long to wait before the next restore.
func (b *writeBucket) wait(now time.Time) time.Duration {
	b.refill(now)
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) * float64(b.interval))
}

// take spends a token on a restore that started at now.
func (b *writeBucket) take(now time.Time) {
	b.refill(now)
	b.tokens--
}
