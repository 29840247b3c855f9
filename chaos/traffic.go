package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TrafficOptions tune the traffic; zero values take the defaults.
type TrafficOptions struct {
	Workers        int           // concurrent workers, each one request at a time (default 6)
	Keys           int           // ConfigMap names the workers share, so that they collide (default 10)
	RequestTimeout time.Duration // per request (default 5s); a request that runs out has an unknown outcome
	Resource       Resource      // what it writes: ConfigMaps (the default) or the suite's custom resources
}

// Traffic makes Kubernetes-style requests on objects of its own namespace (ConfigMaps in chaos-<seed>, or
// custom resources in chaos-cr-<seed>), through every server of a cluster at once, and records them for the
// checks (CheckLinearizable and the others).
//
// Each worker, in a loop: creates an object; reads one and updates it with the read resourceVersion as the
// precondition (optimistic concurrency, as controllers do); reads one and updates it with an older
// resourceVersion, which must fail with 409; reads one and deletes it with a resourceVersion precondition;
// reads one; lists them all. Every request goes to a server picked at random, with a short timeout, and
// client-go's own retries are off so that each request is sent once. Values written are unique, so that a
// lost or resurrected write shows.
type Traffic struct {
	seed      uint64
	namespace string
	keys      []string
	opts      TrafficOptions
	servers   []trafficServer
}

type trafficServer struct {
	name    string // the kubeconfig context
	config  *rest.Config
	client  kubernetes.Interface
	objects objects // the traffic's objects through this server
	http    *http.Client
}

// trafficDataKey is the ConfigMap data key holding the value.
const trafficDataKey = "v"

// NewTraffic builds a client for each context of the kubeconfig (one per server).
func NewTraffic(kubeconfig string, seed uint64, opts TrafficOptions) (*Traffic, error) {
	if opts.Workers <= 0 {
		opts.Workers = 6
	}
	if opts.Keys <= 0 {
		opts.Keys = 10
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 5 * time.Second
	}
	raw, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	names := make([]string, 0, len(raw.Contexts))
	for name := range raw.Contexts {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("%s has no contexts", kubeconfig)
	}
	t := &Traffic{seed: seed, namespace: fmt.Sprintf("chaos-%d", seed), opts: opts}
	if opts.Resource == CustomResources {
		t.namespace = fmt.Sprintf("chaos-cr-%d", seed)
	}
	for i := range opts.Keys {
		t.keys = append(t.keys, fmt.Sprintf("k%d", i))
	}
	for _, name := range names {
		cfg, err := clientcmd.NewNonInteractiveClientConfig(*raw, name, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("%s: context %s: %w", kubeconfig, name, err)
		}
		cfg = trafficRESTConfig(cfg, opts.RequestTimeout)
		httpClient, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: context %s: %w", kubeconfig, name, err)
		}
		client, err := kubernetes.NewForConfigAndClient(cfg, httpClient)
		if err != nil {
			return nil, fmt.Errorf("%s: context %s: %w", kubeconfig, name, err)
		}
		objs, err := opts.Resource.objectsFor(cfg, httpClient, t.namespace)
		if err != nil {
			return nil, fmt.Errorf("%s: context %s: %w", kubeconfig, name, err)
		}
		t.servers = append(t.servers, trafficServer{name: name, config: cfg, client: client, objects: objs, http: httpClient})
	}
	return t, nil
}

// trafficRESTConfig has no client-side rate limit and a transport-level timeout as a backstop. client-go's
// own retries stay on, as every client has them: it resends a request answered with 429 or a 5xx carrying
// Retry-After, which Skiff sends only when the request certainly did nothing (503 "no leader"), never with
// 504 "outcome unknown". Were a write of unknown outcome resent, one that took effect would come back 409
// and be recorded as a definite failure, which the checks catch.
func trafficRESTConfig(cfg *rest.Config, timeout time.Duration) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	cfg.Timeout = timeout + time.Second
	return cfg
}

// Close closes the traffic's idle connections, so that the servers' goroutines serving them end; call it
// when done with Run and ReadFinal.
func (t *Traffic) Close() {
	for _, s := range t.servers {
		s.http.CloseIdleConnections()
	}
}

// Resource is what the traffic writes.
func (t *Traffic) Resource() Resource { return t.opts.Resource }

// Namespace is the namespace the traffic writes in.
func (t *Traffic) Namespace() string { return t.namespace }

// Keys is the names of the ConfigMaps the traffic writes.
func (t *Traffic) Keys() []string { return slices.Clone(t.keys) }

// Servers is the kubeconfig contexts the traffic sends requests to.
func (t *Traffic) Servers() []string {
	var out []string
	for _, s := range t.servers {
		out = append(out, s.name)
	}
	return out
}

// Run prepares the namespace (creating it, and deleting any ConfigMaps of an earlier run) and then runs
// the workers until ctx ends. Requests in flight when ctx ends run to their own timeout, so that the
// history ends with answers where there were any. If the namespace cannot be prepared before ctx ends,
// the history has no operations and Err says why.
func (t *Traffic) Run(ctx context.Context) *History {
	h := &History{Namespace: t.namespace, Servers: t.Servers()}
	if err := t.prepare(ctx); err != nil {
		h.Err = err
		h.Start = time.Now()
		return h
	}
	start := time.Now()
	h.Start = start
	workers := make([]*trafficWorker, t.opts.Workers)
	var wg sync.WaitGroup
	for i := range workers {
		w := &trafficWorker{t: t, id: i, start: start, rng: rand.New(rand.NewPCG(t.seed, uint64(i)+1))}
		workers[i] = w
		wg.Go(func() { w.run(ctx) })
	}
	wg.Wait()
	for _, w := range workers {
		h.Ops = append(h.Ops, w.ops...)
	}
	sort.SliceStable(h.Ops, func(i, j int) bool { return h.Ops[i].Call < h.Ops[j].Call })
	for i := range h.Ops {
		h.Duration = max(h.Duration, h.Ops[i].Return)
	}
	return h
}

// prepare makes the namespace exist and hold none of the traffic's ConfigMaps, retrying through the
// servers in turn until ctx ends. The checks' model starts from that empty state.
func (t *Traffic) prepare(ctx context.Context) error {
	var lastErr error
	for attempt := 0; ; attempt++ {
		s := t.servers[attempt%len(t.servers)]
		lastErr = t.prepareOnce(ctx, s)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("preparing namespace %s: %w (last error: %v)", t.namespace, ctx.Err(), lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (t *Traffic) prepareOnce(ctx context.Context, s trafficServer) error {
	rctx, cancel := context.WithTimeout(ctx, t.opts.RequestTimeout)
	defer cancel()
	if t.opts.Resource == CustomResources {
		if err := ensureCustomCRD(rctx, s.config); err != nil {
			return err
		}
	}
	c := s.client
	ns, err := c.CoreV1().Namespaces().Get(rctx, t.namespace, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.CoreV1().Namespaces().Create(rctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.namespace}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	case err != nil:
		return err
	case ns.DeletionTimestamp != nil:
		return fmt.Errorf("namespace %s is being deleted", t.namespace)
	}
	_, items, err := s.objects.list(rctx)
	if err != nil {
		return err
	}
	left := 0
	for _, it := range items {
		if !slices.Contains(t.keys, it.Key) {
			continue
		}
		left++
		if err := s.objects.delete(rctx, it.Key, it.RV); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	if left > 0 {
		return fmt.Errorf("deleted %d %s left from an earlier run; checking again", left, t.opts.Resource)
	}
	return nil
}

// trafficWorker is one client of the traffic: one request at a time, recorded in ops.
type trafficWorker struct {
	t      *Traffic
	id     int
	start  time.Time
	rng    *rand.Rand
	writes int // values written so far, for unique values
	ops    []Op
}

func (w *trafficWorker) run(ctx context.Context) {
	for ctx.Err() == nil {
		if !w.step(ctx) {
			// Back off a little so that a server that refuses connections is not hammered.
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(20+w.rng.IntN(80)) * time.Millisecond):
			}
		}
	}
}

// step makes one Kubernetes-style action of one or two requests; false if a request did not succeed.
func (w *trafficWorker) step(ctx context.Context) bool {
	key := w.t.keys[w.rng.IntN(len(w.t.keys))]
	switch p := w.rng.IntN(100); {
	case p < 15:
		return w.create(ctx, key).Outcome != OutcomeUnknown
	case p < 45: // read-modify-write
		got := w.get(ctx, key)
		if got.Outcome != OutcomeOK {
			return got.Outcome != OutcomeUnknown
		}
		return w.update(ctx, key, got.RV, false).Outcome != OutcomeUnknown
	case p < 50: // an update with a resourceVersion older than the one just read: must be refused
		got := w.get(ctx, key)
		if got.Outcome != OutcomeOK || got.RV <= 1 {
			return got.Outcome != OutcomeUnknown
		}
		return w.update(ctx, key, got.RV-1-w.rng.Int64N(min(got.RV-1, 3)), true).Outcome != OutcomeUnknown
	case p < 60:
		got := w.get(ctx, key)
		if got.Outcome != OutcomeOK {
			return got.Outcome != OutcomeUnknown
		}
		return w.delete(ctx, key, got.RV).Outcome != OutcomeUnknown
	case p < 80:
		return w.get(ctx, key).Outcome != OutcomeUnknown
	default:
		return w.list(ctx).Outcome != OutcomeUnknown
	}
}

// do sends one request to a random server and records it; f fills in the answer's details on success.
func (w *trafficWorker) do(ctx context.Context, op Op, f func(ctx context.Context, objs objects, op *Op) error) Op {
	s := w.t.servers[w.rng.IntN(len(w.t.servers))]
	op.Worker, op.Server = w.id, s.name
	// A request already sent runs to its own timeout even when the run ends, so that it gets its answer.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.t.opts.RequestTimeout)
	defer cancel()
	op.Call = time.Since(w.start)
	err := f(rctx, s.objects, &op)
	op.Return = time.Since(w.start)
	op.Outcome, op.Code, op.Reason = classifyTrafficError(err)
	if err != nil {
		op.Err = err.Error()
		op.RV, op.Found, op.ReadValue, op.Items = 0, false, "", nil
	}
	w.ops = append(w.ops, op)
	return op
}

// classifyTrafficError tells a definite failure (the server refused: any 4xx but 408) from an unknown
// outcome (no answer, or a 5xx: the request may have taken effect).
func classifyTrafficError(err error) (Outcome, int, string) {
	if err == nil {
		return OutcomeOK, 0, ""
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		s := st.Status()
		code := int(s.Code)
		if code >= 400 && code < 500 && code != http.StatusRequestTimeout {
			return OutcomeFailed, code, string(s.Reason)
		}
		return OutcomeUnknown, code, string(s.Reason)
	}
	return OutcomeUnknown, 0, ""
}

func (w *trafficWorker) nextValue() string {
	w.writes++
	return fmt.Sprintf("w%d-%d", w.id, w.writes)
}

func (w *trafficWorker) create(ctx context.Context, key string) Op {
	return w.do(ctx, Op{Kind: OpCreate, Key: key, Value: w.nextValue()}, func(ctx context.Context, objs objects, op *Op) error {
		var err error
		op.RV, op.ReadValue, err = objs.create(ctx, key, op.Value)
		return err
	})
}

func (w *trafficWorker) update(ctx context.Context, key string, rv int64, stale bool) Op {
	op := Op{Kind: OpUpdate, Key: key, Value: w.nextValue(), PreconditionRV: rv, Stale: stale}
	return w.do(ctx, op, func(ctx context.Context, objs objects, op *Op) error {
		var err error
		op.RV, op.ReadValue, err = objs.update(ctx, key, op.Value, rv)
		return err
	})
}

func (w *trafficWorker) delete(ctx context.Context, key string, rv int64) Op {
	return w.do(ctx, Op{Kind: OpDelete, Key: key, PreconditionRV: rv}, func(ctx context.Context, objs objects, op *Op) error {
		return objs.delete(ctx, key, rv)
	})
}

func (w *trafficWorker) get(ctx context.Context, key string) Op {
	return w.do(ctx, Op{Kind: OpGet, Key: key}, func(ctx context.Context, objs objects, op *Op) error {
		var err error
		op.RV, op.ReadValue, err = objs.get(ctx, key)
		op.Found = err == nil
		return err
	})
}

func (w *trafficWorker) list(ctx context.Context) Op {
	return w.do(ctx, Op{Kind: OpList}, func(ctx context.Context, objs objects, op *Op) error {
		rv, items, err := objs.list(ctx)
		op.Items, op.RV = w.t.ownItems(items), rv
		return err
	})
}

// ownItems keeps the traffic's objects of a list, ordered by name.
func (t *Traffic) ownItems(all []Item) []Item {
	var items []Item
	for _, it := range all {
		if slices.Contains(t.keys, it.Key) {
			items = append(items, it)
		}
	}
	sort.Slice(items, func(i, j int) bool { return items[i].Key < items[j].Key })
	return items
}

// readFinalPatience bounds how long ReadFinal retries one server that does not answer.
const readFinalPatience = time.Minute

// ReadFinal reads the traffic's objects through each server with a consistent list, retrying a server
// that does not answer for up to a minute (or until ctx ends), and returns them by name. Every server must
// answer and return the same objects; if one does not, the error names it (and for a disagreement, the first
// object they disagree on). Call it after the faults are healed and Run has returned.
func (t *Traffic) ReadFinal(ctx context.Context) (map[string]FinalObject, error) {
	var first map[string]FinalObject
	var firstServer string
	for _, s := range t.servers {
		got, err := t.readFinalFrom(ctx, s)
		if err != nil {
			return nil, err
		}
		if first == nil {
			first, firstServer = got, s.name
			continue
		}
		if diff := diffFinal(firstServer, first, s.name, got); diff != "" {
			return nil, fmt.Errorf("servers disagree on the final state of namespace %s: %s", t.namespace, diff)
		}
	}
	return first, nil
}

func (t *Traffic) readFinalFrom(ctx context.Context, s trafficServer) (map[string]FinalObject, error) {
	ctx, cancel := context.WithTimeout(ctx, readFinalPatience)
	defer cancel()
	var lastErr error
	for {
		rctx, cancel := context.WithTimeout(ctx, t.opts.RequestTimeout)
		_, items, err := s.objects.list(rctx)
		cancel()
		if err == nil {
			out := map[string]FinalObject{}
			for _, it := range t.ownItems(items) {
				out[it.Key] = FinalObject{Value: it.Value, RV: it.RV}
			}
			return out, nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("final list through %s: %w (last error: %v)", s.name, ctx.Err(), lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// diffFinal describes the first difference between two servers' final states; "" if they are equal.
func diffFinal(nameA string, a map[string]FinalObject, nameB string, b map[string]FinalObject) string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	describe := func(m map[string]FinalObject, k string) string {
		o, ok := m[k]
		if !ok {
			return "no " + k
		}
		return fmt.Sprintf("%s=%s (rv %d)", k, o.Value, o.RV)
	}
	for _, k := range keys {
		oa, inA := a[k]
		ob, inB := b[k]
		if inA != inB || oa != ob {
			return fmt.Sprintf("%s has %s, %s has %s", nameA, describe(a, k), nameB, describe(b, k))
		}
	}
	return ""
}
