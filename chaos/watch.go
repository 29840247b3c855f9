package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The watch checks follow etcd's robustness suite (tests/robustness/validate/watch.go), on the Kubernetes API
// instead of etcd's: every stream is checked on its own (ordered, unique, bookmarks), then against the union of
// what all streams saw (reliable, resumable) and the streams against one another (agreement).

// WatchEvent is one thing a watch stream delivered: an object event or a bookmark.
type WatchEvent struct {
	Type watch.EventType // Added, Modified, Deleted or Bookmark
	Name string          // the ConfigMap's name; empty for a bookmark
	RV   int64           // the object's resourceVersion (a deletion's own revision); a bookmark's
	// Value is the ConfigMap's value as the traffic writes it (see configMapValue); empty for a bookmark.
	Value string
	At    time.Time // when it arrived
}

func (e WatchEvent) String() string {
	if e.Type == watch.Bookmark {
		return fmt.Sprintf("BOOKMARK rv=%d", e.RV)
	}
	return fmt.Sprintf("%s %s=%s rv=%d", e.Type, e.Name, e.Value, e.RV)
}

// sameEvent compares what two servers must agree on, leaving out the arrival time.
func sameEvent(a, b WatchEvent) bool {
	return a.Type == b.Type && a.Name == b.Name && a.RV == b.RV && a.Value == b.Value
}

// The origins of a stream's start resourceVersion.
const (
	OriginNow    = "now"    // the resourceVersion of a fresh list: everything after the list
	OriginRecent = "recent" // the resourceVersion of an object of a fresh list, chosen at random among the newest
	OriginResume = "resume" // the last resourceVersion the watcher's previous stream delivered (event or bookmark)
)

// WatchStream is one watch request, from its start until it ended.
type WatchStream struct {
	ID int // its index in WatchReport.Streams
	// Watcher names the consumer it belongs to, "server-2/recent-1": a watcher's streams follow one another,
	// each resuming the last, until a 410 Gone makes it start over from a fresh list.
	Watcher string
	Server  string // the kubeconfig context it was sent to
	Origin  string // OriginNow, OriginRecent or OriginResume
	StartRV int64  // the resourceVersion it asked for: it must deliver exactly the events after it
	// Resumes is the ID of the stream this one resumes, -1 for none.
	Resumes        int
	Started, Ended time.Time
	// Events are the events and bookmarks in the order they arrived.
	Events []WatchEvent
	// Err says why it ended: empty when the server closed it (its timeout), otherwise the error, which may
	// have come before any event (the server was down, the list for the start failed).
	Err string
	// Code is the HTTP status of the error that ended it when there was one: 410 for Gone (the start
	// resourceVersion is too old; the watcher relists, which is allowed), 504 for a resourceVersion the
	// server had not reached in time.
	Code int
}

// Gone is true for a stream that ended with 410 Gone.
func (s *WatchStream) Gone() bool { return s.Code == http.StatusGone }

func (s *WatchStream) String() string {
	return fmt.Sprintf("stream %d (%s via %s, %s from rv=%d)", s.ID, s.Watcher, s.Server, s.Origin, s.StartRV)
}

// objectEvents are the stream's events without its bookmarks.
func (s *WatchStream) objectEvents() []WatchEvent {
	var out []WatchEvent
	for _, e := range s.Events {
		if e.Type != watch.Bookmark {
			out = append(out, e)
		}
	}
	return out
}

// WatchReport is what the watchers of a round recorded.
type WatchReport struct {
	Namespace string
	Streams   []*WatchStream
}

// Summary counts the streams, events, resumes, 410s and failures, for the round's report.
func (r *WatchReport) Summary() string {
	var events, bookmarks, resumes, gone, failed int
	for _, s := range r.Streams {
		for _, e := range s.Events {
			if e.Type == watch.Bookmark {
				bookmarks++
			} else {
				events++
			}
		}
		if s.Origin == OriginResume {
			resumes++
		}
		if s.Gone() {
			gone++
		} else if s.Err != "" && s.Err != errStopped && len(s.Events) == 0 {
			failed++
		}
	}
	return fmt.Sprintf("%d watch streams (%d resumed, %d ended 410 Gone, %d failed before any event), %d events, %d bookmarks",
		len(r.Streams), resumes, gone, failed, events, bookmarks)
}

// Check runs every watch check and joins their errors.
func (r *WatchReport) Check() error {
	return errors.Join(r.CheckOrdered(), r.CheckUnique(), r.CheckAgreement(), r.CheckResumable(), r.CheckReliable())
}

// CheckOrdered: within a stream, events come in strictly increasing resourceVersion; bookmarks never go
// backwards (not below the start, the last event or the last bookmark), and an event after a bookmark is newer
// than the bookmark (a bookmark promises that everything up to it was delivered).
func (r *WatchReport) CheckOrdered() error {
	for _, s := range r.Streams {
		var lastEvent, lastBookmark int64
		for i, e := range s.Events {
			if e.Type == watch.Bookmark {
				switch {
				case e.RV < s.StartRV:
					return fmt.Errorf("ordered: %s: bookmark %d at rv=%d is below the start", s, i, e.RV)
				case e.RV < lastEvent:
					return fmt.Errorf("ordered: %s: bookmark %d at rv=%d goes back before the event at rv=%d", s, i, e.RV, lastEvent)
				case e.RV < lastBookmark:
					return fmt.Errorf("ordered: %s: bookmark %d at rv=%d goes back before the bookmark at rv=%d", s, i, e.RV, lastBookmark)
				}
				lastBookmark = e.RV
				continue
			}
			switch {
			case e.RV <= lastEvent:
				return fmt.Errorf("ordered: %s: event %d %v comes after rv=%d", s, i, e, lastEvent)
			case e.RV <= lastBookmark:
				return fmt.Errorf("ordered: %s: event %d %v comes after a bookmark at rv=%d", s, i, e, lastBookmark)
			}
			lastEvent = e.RV
		}
	}
	return nil
}

// CheckUnique: no event (name and resourceVersion) comes twice in a stream.
func (r *WatchReport) CheckUnique() error {
	type key struct {
		name string
		rv   int64
	}
	for _, s := range r.Streams {
		seen := map[key]int{}
		for i, e := range s.Events {
			if e.Type == watch.Bookmark {
				continue
			}
			k := key{e.Name, e.RV}
			if j, ok := seen[k]; ok {
				return fmt.Errorf("unique: %s: event %d %v repeats event %d", s, i, e, j)
			}
			seen[k] = i
		}
	}
	return nil
}

// revisionEvents is what one stream delivered at one resourceVersion, ordered by name: one event, unless a
// transaction changed several objects at once.
type revisionEvents struct {
	stream *WatchStream
	events []WatchEvent
}

// byRevision groups every stream's events by resourceVersion, streams in report order.
func (r *WatchReport) byRevision() map[int64][]revisionEvents {
	out := map[int64][]revisionEvents{}
	for _, s := range r.Streams {
		groups := map[int64][]WatchEvent{}
		for _, e := range s.objectEvents() {
			groups[e.RV] = append(groups[e.RV], e)
		}
		for rv, evs := range groups {
			slices.SortFunc(evs, func(a, b WatchEvent) int { return strings.Compare(a.Name, b.Name) })
			out[rv] = append(out[rv], revisionEvents{stream: s, events: evs})
		}
	}
	return out
}

// CheckAgreement: every stream that delivered something at a resourceVersion delivered the same events
// (type, name, value), whichever server it watched.
func (r *WatchReport) CheckAgreement() error {
	byRV := r.byRevision()
	rvs := make([]int64, 0, len(byRV))
	for rv := range byRV {
		rvs = append(rvs, rv)
	}
	slices.Sort(rvs)
	for _, rv := range rvs {
		groups := byRV[rv]
		first := groups[0]
		for _, g := range groups[1:] {
			if !slices.EqualFunc(first.events, g.events, sameEvent) {
				return fmt.Errorf("agreement: at rv=%d %s saw %v but %s saw %v", rv, first.stream, first.events, g.stream, g.events)
			}
		}
	}
	return nil
}

// unionEvent is an event of the union, with the first stream that delivered it.
type unionEvent struct {
	WatchEvent
	by *WatchStream
}

// Union is every event any stream delivered, once, in resourceVersion then name order. Where streams disagree
// (CheckAgreement fails), the first stream's events stand.
func (r *WatchReport) Union() []WatchEvent {
	var out []WatchEvent
	for _, u := range r.union() {
		out = append(out, u.WatchEvent)
	}
	return out
}

func (r *WatchReport) union() []unionEvent {
	var out []unionEvent
	for _, groups := range r.byRevision() {
		for _, e := range groups[0].events {
			out = append(out, unionEvent{e, groups[0].stream})
		}
	}
	slices.SortFunc(out, func(a, b unionEvent) int {
		return cmp.Or(cmp.Compare(a.RV, b.RV), strings.Compare(a.Name, b.Name))
	})
	return out
}

// CheckResumable: a stream started at resourceVersion r delivers exactly the events after r: none at or
// before r, and its first event is the union's first event after r. This covers resumed streams (r is the
// last resourceVersion their watcher saw) and fresh ones alike.
func (r *WatchReport) CheckResumable() error {
	union := r.union()
	for _, s := range r.Streams {
		evs := s.objectEvents()
		if len(evs) == 0 {
			continue
		}
		if evs[0].RV <= s.StartRV {
			return fmt.Errorf("resumable: %s delivered %v, not after its start", s, evs[0])
		}
		i, _ := slices.BinarySearchFunc(union, s.StartRV+1, func(u unionEvent, rv int64) int { return cmp.Compare(u.RV, rv) })
		if i < len(union) && !sameEvent(union[i].WatchEvent, evs[0]) && union[i].RV <= evs[0].RV {
			return fmt.Errorf("resumable: %s starts with %v but misses %v, the first event after rv=%d (delivered by %s)",
				s, evs[0], union[i].WatchEvent, s.StartRV, union[i].by)
		}
	}
	return nil
}

// CheckReliable: a stream drops nothing. Every event of the union between the stream's first event and the
// last resourceVersion it reached (its last event, or a later bookmark, which promises everything before it)
// is in the stream.
func (r *WatchReport) CheckReliable() error {
	type key struct {
		name string
		rv   int64
	}
	union := r.union()
	for _, s := range r.Streams {
		evs := s.objectEvents()
		var reached int64
		for _, e := range s.Events {
			reached = max(reached, e.RV)
		}
		from := s.StartRV // what CheckResumable has checked up to
		if len(evs) > 0 {
			from = evs[0].RV
		}
		if reached <= from {
			continue
		}
		got := map[key]bool{}
		for _, e := range evs {
			got[key{e.Name, e.RV}] = true
		}
		i, _ := slices.BinarySearchFunc(union, from+1, func(u unionEvent, rv int64) int { return cmp.Compare(u.RV, rv) })
		for ; i < len(union) && union[i].RV <= reached; i++ {
			if u := union[i]; !got[key{u.Name, u.RV}] {
				return fmt.Errorf("reliable: %s misses %v (delivered by %s) although it reached rv=%d", s, u.WatchEvent, u.by, reached)
			}
		}
	}
	return nil
}

// CheckWatchAgainstHistory compares what the watches saw with what the traffic did. It looks only at the
// traffic's keys and at resourceVersions from the first one the traffic was answered with on, since the
// traffic's preparation deletes what an earlier run left, unrecorded.
//   - every ADDED or MODIFIED event carries a value that a create or update of the same key wrote (values are
//     unique in a history), ADDED for a create and MODIFIED for an update, at the acknowledged
//     resourceVersion if the write was acknowledged, and never one of a write that definitely failed;
//   - every DELETED event is of a key the traffic tried to delete;
//   - every create or update the server acknowledged, at a resourceVersion some stream covered (it started
//     before it and reached it), was delivered.
func CheckWatchAgainstHistory(report *WatchReport, hist *History) error {
	writes := map[string]*Op{} // by value
	keys := map[string]bool{}
	deleted := map[string]bool{}
	var firstRV int64
	for i := range hist.Ops {
		op := &hist.Ops[i]
		if op.Key != "" {
			keys[op.Key] = true
		}
		if op.RV > 0 && (firstRV == 0 || op.RV < firstRV) {
			firstRV = op.RV
		}
		switch op.Kind {
		case OpCreate, OpUpdate:
			if op.Value != "" {
				writes[op.Value] = op
			}
		case OpDelete:
			deleted[op.Key] = true
		}
	}
	union := report.union()
	for _, u := range union {
		if !keys[u.Name] || u.RV < firstRV {
			continue
		}
		switch u.Type {
		case watch.Deleted:
			if !deleted[u.Name] {
				return fmt.Errorf("history: %s delivered %v, but the traffic never deleted %s", u.by, u.WatchEvent, u.Name)
			}
			continue
		case watch.Added, watch.Modified:
		default:
			continue
		}
		op, ok := writes[u.Value]
		if !ok {
			return fmt.Errorf("history: %s delivered %v, a value the traffic never wrote", u.by, u.WatchEvent)
		}
		want := watch.Added
		if op.Kind == OpUpdate {
			want = watch.Modified
		}
		switch {
		case op.Key != u.Name:
			return fmt.Errorf("history: %s delivered %v, but the value was written to %s: %v", u.by, u.WatchEvent, op.Key, op)
		case u.Type != want:
			return fmt.Errorf("history: %s delivered %v for %v", u.by, u.WatchEvent, op)
		case op.Outcome == OutcomeFailed:
			return fmt.Errorf("history: %s delivered %v, but the write failed: %v", u.by, u.WatchEvent, op)
		case op.Outcome == OutcomeOK && op.RV != 0 && op.RV != u.RV:
			return fmt.Errorf("history: %s delivered %v, but the write was acknowledged at rv=%d: %v", u.by, u.WatchEvent, op.RV, op)
		}
	}
	type key struct {
		name string
		rv   int64
	}
	seen := map[key]bool{}
	for _, u := range union {
		seen[key{u.Name, u.RV}] = true
	}
	for i := range hist.Ops {
		op := &hist.Ops[i]
		if !op.acked() || op.RV == 0 || seen[key{op.Key, op.RV}] {
			continue
		}
		for _, s := range report.Streams {
			if s.StartRV < op.RV && reachedRV(s) >= op.RV {
				return fmt.Errorf("history: acknowledged %v was delivered by no stream, although %s reached rv=%d", op, s, reachedRV(s))
			}
		}
	}
	return nil
}

// reachedRV is the last resourceVersion a stream delivered, event or bookmark.
func reachedRV(s *WatchStream) int64 {
	var rv int64
	for _, e := range s.Events {
		rv = max(rv, e.RV)
	}
	return rv
}

// Watchers watch the ConfigMaps of a namespace through every server of a kubeconfig and record what they
// see, for the checks of WatchReport.
type Watchers struct {
	namespace string
	resource  Resource
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	mu      sync.Mutex
	streams []*WatchStream
	report  *WatchReport
}

// errStopped is the Err of a stream that Stop ended.
const errStopped = "stopped by the suite"

// watchersPerServer is how many watchers each server gets: the first starts from "now", the others from
// recent resourceVersions.
const watchersPerServer = 3

// watchTimeout bounds a stream's timeoutSeconds, chosen at random so that streams end, and watchers resume,
// at different times.
var watchTimeout = [2]int{2, 15}

// StartWatchers starts watchersPerServer watchers of the ConfigMaps in namespace through each context (server)
// of the kubeconfig, all with bookmarks. A watcher starts from a fresh list (its resourceVersion, or a recent
// object's), and whenever a stream ends (the server's timeout, a killed server, an error) resumes from the
// last resourceVersion it saw; after a 410 Gone it starts over from a fresh list. seed makes the random
// choices. The watchers run until Stop or until ctx ends.
func StartWatchers(ctx context.Context, kubeconfig, namespace string, resource Resource, seed uint64) (*Watchers, error) {
	servers, err := serverClients(kubeconfig)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &Watchers{namespace: namespace, resource: resource, cancel: cancel}
	rng := rand.New(rand.NewPCG(seed, 0x3a7c4))
	for _, s := range servers {
		for i := range watchersPerServer {
			origin := OriginRecent
			if i == 0 {
				origin = OriginNow
			}
			httpClient, err := rest.HTTPClientFor(s.config)
			if err != nil {
				cancel()
				return nil, err
			}
			objs, err := resource.objectsFor(s.config, httpClient, namespace)
			if err != nil {
				cancel()
				return nil, err
			}
			wt := &watcher{
				w: w, name: fmt.Sprintf("%s/%s-%d", s.name, origin, i), server: s, objects: objs, origin: origin,
				rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())),
			}
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				wt.run(ctx)
			}()
		}
	}
	return w, nil
}

// Stop stops the watchers, waits for them, and returns what they recorded. Later calls return the same
// report.
func (w *Watchers) Stop() *WatchReport {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.report == nil {
		w.report = &WatchReport{Namespace: w.namespace, Streams: w.streams}
	}
	return w.report
}

// add numbers a new stream and keeps it.
func (w *Watchers) add(s *WatchStream) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s.ID = len(w.streams)
	w.streams = append(w.streams, s)
}

// watcher is one consumer: a chain of streams through one server.
type watcher struct {
	w       *Watchers
	name    string
	server  serverClient
	objects objects // the watched objects through server
	origin  string
	rng     *rand.Rand
}

func (wt *watcher) run(ctx context.Context) {
	var last int64 // the resourceVersion to resume from; 0: start from a fresh list
	prev := -1
	for ctx.Err() == nil {
		s := &WatchStream{Watcher: wt.name, Server: wt.server.name, Resumes: -1, Started: time.Now()}
		if last > 0 {
			s.Origin, s.StartRV, s.Resumes = OriginResume, last, prev
		} else {
			s.Origin = wt.origin
			rv, err := wt.startRV(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.Err, s.Ended = "listing for the start: "+err.Error(), time.Now()
				wt.w.add(s)
				wt.pause(ctx)
				continue
			}
			s.StartRV = rv
		}
		wt.w.add(s)
		wt.stream(ctx, s)
		prev = s.ID
		// The next stream resumes where this one got to, even with nothing delivered.
		last = max(last, s.StartRV, reachedRV(s))
		switch {
		case s.Gone():
			last = 0
		case len(s.Events) == 0 && s.Err != "":
			wt.pause(ctx)
		}
	}
}

// pause waits a little before the next attempt through a server that failed.
func (wt *watcher) pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(100+wt.rng.IntN(400)) * time.Millisecond):
	}
}

// startRV lists the namespace through the watcher's server and picks a start: the list's resourceVersion
// ("now"), or the resourceVersion of one of the ten newest objects ("recent").
func (wt *watcher) startRV(ctx context.Context) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	listRV, items, err := wt.objects.list(lctx)
	if err != nil {
		return 0, err
	}
	if wt.origin == OriginNow || len(items) == 0 {
		return listRV, nil
	}
	var rvs []int64
	for _, it := range items {
		rvs = append(rvs, it.RV)
	}
	if len(rvs) == 0 {
		return listRV, nil
	}
	slices.Sort(rvs)
	rvs = rvs[max(0, len(rvs)-10):]
	return rvs[wt.rng.IntN(len(rvs))], nil
}

// stream runs one watch request and records it in s.
func (wt *watcher) stream(ctx context.Context, s *WatchStream) {
	defer func() { s.Ended = time.Now() }()
	timeout := int64(watchTimeout[0] + wt.rng.IntN(watchTimeout[1]-watchTimeout[0]+1))
	// A partitioned server may never close the stream: give up some time after its timeout.
	wctx, cancel := context.WithTimeout(ctx, time.Duration(timeout)*time.Second+10*time.Second)
	defer cancel()
	wi, err := wt.objects.watch(wctx, metav1.ListOptions{
		ResourceVersion: fmt.Sprint(s.StartRV), AllowWatchBookmarks: true, TimeoutSeconds: &timeout,
	})
	if err != nil {
		s.Err, s.Code = err.Error(), statusCode(err)
		return
	}
	defer wi.Stop()
	// cut says why the stream ended when the client ended it.
	cut := func() {
		switch {
		case ctx.Err() != nil:
			s.Err = errStopped
		case wctx.Err() != nil:
			s.Err = fmt.Sprintf("the server did not end the stream 10s after its timeout (%ds)", timeout)
		}
	}
	for {
		select {
		case <-wctx.Done():
			cut()
			return
		case ev, ok := <-wi.ResultChan():
			if !ok {
				cut()
				return
			}
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				s.Err, s.Code = err.Error(), statusCode(err)
				return
			}
			e, err := watchEvent(wt.objects, ev)
			if err != nil {
				s.Err = err.Error()
				return
			}
			s.Events = append(s.Events, e)
		}
	}
}

// watchEvent records a watch event of one of the objects.
func watchEvent(objs objects, ev watch.Event) (WatchEvent, error) {
	name, value, rv, err := objs.event(ev)
	if err != nil {
		return WatchEvent{}, fmt.Errorf("a %s event: %w", ev.Type, err)
	}
	e := WatchEvent{Type: ev.Type, RV: rv, At: time.Now()}
	if ev.Type != watch.Bookmark {
		e.Name, e.Value = name, value
	}
	return e, nil
}

// configMapValue is the value a ConfigMap holds as the traffic writes it: its data under trafficDataKey
// when that is its only key, otherwise all of its data as JSON (keys sorted).
func configMapValue(cm *corev1.ConfigMap) string {
	if v, ok := cm.Data[trafficDataKey]; ok && len(cm.Data) == 1 {
		return v
	}
	if len(cm.Data) == 0 {
		return "{}"
	}
	b, _ := json.Marshal(cm.Data)
	return string(b)
}

// statusCode is the HTTP status of an API error, 0 for another error.
func statusCode(err error) int {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return int(st.Status().Code)
	}
	return 0
}

func parseRV(s string) (int64, error) {
	var rv int64
	if _, err := fmt.Sscan(s, &rv); err != nil || rv <= 0 {
		return 0, fmt.Errorf("resourceVersion %q is not a positive integer", s)
	}
	return rv, nil
}

// serverClient is one server of a kubeconfig: its context's name and clients for it, with no client-side rate
// limit.
type serverClient struct {
	name   string
	config *rest.Config
	client kubernetes.Interface
}

// serverClients makes a client for each context of the kubeconfig, in context name order.
func serverClients(kubeconfig string) ([]serverClient, error) {
	raw, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return nil, err
	}
	var out []serverClient
	for name := range raw.Contexts {
		cfg, err := clientcmd.NewNonInteractiveClientConfig(*raw, name, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("%s: context %s: %w", kubeconfig, name, err)
		}
		cfg.QPS, cfg.Burst = -1, 0
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: context %s: %w", kubeconfig, name, err)
		}
		out = append(out, serverClient{name: name, config: cfg, client: client})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no context", kubeconfig)
	}
	slices.SortFunc(out, func(a, b serverClient) int { return strings.Compare(a.name, b.name) })
	return out, nil
}
