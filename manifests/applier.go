package manifests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// Config is what an Applier needs.
type Config struct {
	// Dir is the folder; it is created when missing.
	Dir string
	// REST reaches the API as a user who may write every kind a manifest holds (the admin).
	REST   *rest.Config
	Logger hclog.Logger
	// Rescan is how often the folder is read again in case a change was not notified (5 s when zero);
	// Debounce how long after a notified change the file is read, so that a write in several steps is read
	// once it is whole (100 ms when zero).
	Rescan, Debounce time.Duration
}

// Run applies the folder until ctx ends: every file at once, then each file again when it changes, and the
// records of files that are gone. Run it while this server leads; it starts over with each term.
func Run(ctx context.Context, cfg Config) error {
	a, err := newApplier(cfg)
	if err != nil {
		return err
	}
	defer a.broadcaster.Shutdown()
	return a.run(ctx)
}

// applier is one leadership term's: its checksums say what it has tried, nothing more.
type applier struct {
	cfg         Config
	log         hclog.Logger
	kube        kubernetes.Interface
	dyn         dynamic.Interface
	mapper      *restmapper.DeferredDiscoveryRESTMapper
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	queue       workqueue.TypedRateLimitingInterface[string]
	// tried is the checksum of each file's content last attempted ("" for a file gone), so that a rescan
	// queues only what changed; failures come back through the queue's backoff instead.
	triedMu sync.Mutex
	tried   map[string]string
}

func newApplier(cfg Config) (*applier, error) {
	if cfg.Rescan == 0 {
		cfg.Rescan = 5 * time.Second
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	kube, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg.REST)
	if err != nil {
		return nil, err
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return &applier{
		cfg: cfg, log: cfg.Logger, kube: kube, dyn: dyn,
		mapper:      restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kube.Discovery())),
		broadcaster: broadcaster,
		recorder:    broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: FieldManager}),
		// A file the API refused is tried again after 250 ms, doubling to 2 minutes.
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](250*time.Millisecond, 2*time.Minute)),
		tried: map[string]string{},
	}, nil
}

func (a *applier) run(ctx context.Context) error {
	if err := os.MkdirAll(a.cfg.Dir, 0o755); err != nil {
		return err
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer watcher.Close()
	if err := watcher.Add(a.cfg.Dir); err != nil {
		a.log.Warn("watching the manifests folder; reading it every rescan instead", "dir", a.cfg.Dir, "error", err)
	}
	// One worker: files apply one at a time, in the order queued. It has finished when run returns, so that
	// the next term's applier never overlaps this one.
	var worker sync.WaitGroup
	worker.Add(1)
	go func() {
		defer worker.Done()
		for a.work(ctx) {
		}
	}()
	defer worker.Wait()
	defer a.queue.ShutDown()
	// Every file, and every recorded file, once; in name order, as they are queued.
	for ctx.Err() == nil {
		recorded, err := a.recordedFiles(ctx)
		if err == nil {
			names := a.folder()
			for _, f := range recorded {
				names = append(names, f)
			}
			sort.Strings(names)
			for _, f := range names {
				a.queue.Add(f)
			}
			break
		}
		a.log.Warn("listing the manifests' records", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	// Read discovery now, not when the first file comes, so that a file dropped into an empty folder is
	// applied without waiting for it.
	if _, err := a.mapping(schema.GroupKind{Kind: "ConfigMap"}); err != nil && ctx.Err() == nil {
		a.log.Warn("reading the API's discovery", "error", err)
	}
	rescan := time.NewTicker(a.cfg.Rescan)
	defer rescan.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return nil
			}
			if name := filepath.Base(ev.Name); filepath.Dir(ev.Name) == filepath.Clean(a.cfg.Dir) && IsManifest(name) {
				a.queue.AddAfter(name, a.cfg.Debounce)
			}
		case err, ok := <-watcher.Errors:
			if !ok {
				return nil
			}
			a.log.Warn("watching the manifests folder", "dir", a.cfg.Dir, "error", err)
		case <-rescan.C:
			a.rescan()
		}
	}
}

// folder lists the manifests in the folder (not its subfolders).
func (a *applier) folder() []string {
	entries, err := os.ReadDir(a.cfg.Dir)
	if err != nil {
		a.log.Warn("reading the manifests folder", "dir", a.cfg.Dir, "error", err)
		return nil
	}
	var names []string
	for _, e := range entries {
		if IsManifest(e.Name()) && !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

// rescan queues the files whose content differs from what was last tried, and the tried files now gone.
func (a *applier) rescan() {
	present := map[string]bool{}
	for _, name := range a.folder() {
		present[name] = true
		data, err := os.ReadFile(filepath.Join(a.cfg.Dir, name))
		if err == nil && a.triedSum(name) != Checksum(data) {
			a.queue.Add(name)
		}
	}
	for _, name := range a.triedFiles() {
		if !present[name] && a.triedSum(name) != "" {
			a.queue.Add(name)
		}
	}
}

// The worker writes tried and the run loop's rescan reads it.
func (a *applier) triedSum(name string) string {
	a.triedMu.Lock()
	defer a.triedMu.Unlock()
	return a.tried[name]
}

func (a *applier) setTried(name, sum string) {
	a.triedMu.Lock()
	defer a.triedMu.Unlock()
	a.tried[name] = sum
}

func (a *applier) triedFiles() []string {
	a.triedMu.Lock()
	defer a.triedMu.Unlock()
	var out []string
	for name := range a.tried {
		out = append(out, name)
	}
	return out
}

func (a *applier) recordedFiles(ctx context.Context) ([]string, error) {
	list, err := a.kube.CoreV1().ConfigMaps(RecordNamespace).List(ctx, metav1.ListOptions{LabelSelector: RecordLabel})
	if err != nil {
		return nil, err
	}
	var files []string
	for _, cm := range list.Items {
		if f := cm.Data["file"]; f != "" && RecordName(f) == cm.Name {
			files = append(files, f)
		}
	}
	return files, nil
}

func (a *applier) work(ctx context.Context) bool {
	name, quit := a.queue.Get()
	if quit {
		return false
	}
	defer a.queue.Done(name)
	if err := a.sync(ctx, name); err != nil {
		if ctx.Err() != nil {
			return true
		}
		if !errors.As(err, new(reported)) {
			a.log.Warn("applying a manifest; trying again", "file", filepath.Join(a.cfg.Dir, name), "error", err)
		}
		a.queue.AddRateLimited(name)
		return true
	}
	a.queue.Forget(name)
	return true
}

// reported is an error sync has logged and made an Event of already.
type reported struct{ error }

// sync brings the cluster to a file:
//  1. read and parse it; a file that is gone deletes what its record lists, then the record;
//  2. map each object to its resource (a namespaced object without a namespace goes to "default");
//  3. record the union of what was recorded and what the file holds, before applying anything, so that an
//     object is never applied unrecorded (a leader that dies next leaves a record its successor reads);
//  4. apply each object, forced, under FieldManager, labelled with the file;
//  5. delete what the record lists and the file no longer holds (if it still carries this file's label);
//  6. record what the file holds (and what could not be deleted), the checksum, and the error if any;
//     an error is also an Event on the record and a log line, and the file is tried again with backoff.
func (a *applier) sync(ctx context.Context, name string) error {
	path := filepath.Join(a.cfg.Dir, name)
	rec, cm, err := a.getRecord(ctx, name)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return a.removed(ctx, name, rec, cm)
	} else if err != nil {
		return err
	}
	sum := Checksum(data)
	a.setTried(name, sum)
	prev := rec
	objs, err := Parse(data)
	if err != nil {
		rec.Checksum, rec.Error = sum, err.Error()
		if cm, err = a.putRecord(ctx, name, rec, cm); err != nil {
			return err
		}
		a.event(name, cm, corev1.EventTypeWarning, "ParseFailed", "%s: %s", path, rec.Error)
		a.log.Error("a manifest does not parse; its objects are left as they are", "file", path, "error", rec.Error)
		return nil // until the file changes
	}

	var errs []string
	var refs, unmapped []Ref
	type mapped struct {
		obj     *unstructured.Unstructured
		mapping *meta.RESTMapping
	}
	var todo []mapped
	for _, o := range objs {
		mapping, err := a.mapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			// Not applied now; whatever was recorded of it may exist and stays, neither deleted nor forgotten.
			errs = append(errs, fmt.Sprintf("%s: %v", RefOf(o), err))
			unmapped = append(unmapped, matching(prev.Objects, o)...)
			continue
		}
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if o.GetNamespace() == "" {
				o.SetNamespace(metav1.NamespaceDefault)
			}
		} else {
			o.SetNamespace("")
		}
		Label(o, name)
		refs = append(refs, RefOf(o))
		todo = append(todo, mapped{o, mapping})
	}
	if len(Minus(refs, rec.Objects)) > 0 {
		rec.Objects = Union(rec.Objects, refs)
		if cm, err = a.putRecord(ctx, name, rec, cm); err != nil {
			return err
		}
	}
	for _, m := range todo {
		body, err := json.Marshal(m.obj.Object)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", RefOf(m.obj), err))
			continue
		}
		_, err = a.resource(m.mapping, m.obj.GetNamespace()).Patch(ctx, m.obj.GetName(), types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: FieldManager, Force: ptr.To(true)})
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", RefOf(m.obj), err))
		}
	}
	// What the file no longer holds; what could not be deleted stays recorded, to be deleted on the retry.
	keep := Union(refs, unmapped)
	var kept []Ref
	for _, r := range Minus(prev.Objects, keep) {
		if err := a.deleteObject(ctx, name, r); err != nil {
			errs = append(errs, fmt.Sprintf("deleting %s: %v", r, err))
			kept = append(kept, r)
		}
	}
	rec.Objects = Union(keep, kept)
	rec.Checksum, rec.Error = sum, strings.Join(errs, "; ")
	changed := prev.Checksum != sum || prev.Error != ""
	cm, err = a.putRecord(ctx, name, rec, cm)
	if len(errs) > 0 {
		msg := fmt.Sprintf("%s: %s", path, strings.Join(errs, "; "))
		a.event(name, cm, corev1.EventTypeWarning, "ApplyFailed", "%s", msg)
		a.log.Error("a manifest was not wholly applied; trying again", "file", path, "errors", strings.Join(errs, "; "))
		return reported{errors.New(rec.Error)}
	}
	if err != nil {
		return err
	}
	if changed {
		a.event(name, cm, corev1.EventTypeNormal, "Applied", "%s: applied %d objects", path, len(refs))
		a.log.Info("applied a manifest", "file", path, "objects", len(refs))
	}
	return nil
}

// matching is the recorded refs of an object the file names without a namespace, in any namespace.
func matching(recorded []Ref, o *unstructured.Unstructured) []Ref {
	var out []Ref
	for _, r := range recorded {
		if r.GroupKind() == o.GroupVersionKind().GroupKind() && r.Name == o.GetName() {
			out = append(out, r)
		}
	}
	return out
}

// removed handles a file that is gone: what its record lists is deleted, then the record.
func (a *applier) removed(ctx context.Context, name string, rec Record, cm *corev1.ConfigMap) error {
	a.setTried(name, "")
	if cm == nil {
		return nil
	}
	var kept []Ref
	var errs []string
	for _, r := range rec.Objects {
		if err := a.deleteObject(ctx, name, r); err != nil {
			errs = append(errs, fmt.Sprintf("deleting %s: %v", r, err))
			kept = append(kept, r)
		}
	}
	if len(errs) > 0 {
		rec.Objects, rec.Error = kept, strings.Join(errs, "; ")
		cm, _ = a.putRecord(ctx, name, rec, cm)
		a.event(name, cm, corev1.EventTypeWarning, "DeleteFailed", "%s (removed): %s", filepath.Join(a.cfg.Dir, name), rec.Error)
		a.log.Error("a removed manifest's objects were not all deleted; trying again", "file", filepath.Join(a.cfg.Dir, name), "errors", rec.Error)
		return reported{errors.New(rec.Error)}
	}
	err := a.kube.CoreV1().ConfigMaps(RecordNamespace).Delete(ctx, cm.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cm.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	a.log.Info("a manifest was removed; deleted its objects", "file", filepath.Join(a.cfg.Dir, name), "objects", len(rec.Objects))
	return nil
}

// deleteObject deletes an object a file applied, unless it is gone, or its kind is (nothing of it can
// exist), or it no longer carries the file's label (another file, or someone, has taken it over).
func (a *applier) deleteObject(ctx context.Context, name string, r Ref) error {
	mapping, err := a.mapping(r.GroupKind())
	if meta.IsNoMatchError(err) {
		return nil
	} else if err != nil {
		return err
	}
	ns := r.Namespace
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		ns = ""
	}
	res := a.resource(mapping, ns)
	obj, err := res.Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if obj.GetLabels()[FileLabel] != Key(name) {
		a.log.Info("not deleting an object another file or someone else took over", "file", name, "object", r.String(), "label", obj.GetLabels()[FileLabel])
		return nil
	}
	uid := obj.GetUID()
	err = res.Delete(ctx, r.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid},
		PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) { // gone, or replaced by an object of its own
		return nil
	}
	return err
}

func (a *applier) mapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	m, err := a.mapper.RESTMapping(gk, versions...)
	if meta.IsNoMatchError(err) {
		// A kind created since discovery was read (a CRD this or another file holds): read it again.
		a.mapper.Reset()
		m, err = a.mapper.RESTMapping(gk, versions...)
	}
	return m, err
}

func (a *applier) resource(m *meta.RESTMapping, ns string) dynamic.ResourceInterface {
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.dyn.Resource(m.Resource).Namespace(ns)
	}
	return a.dyn.Resource(m.Resource)
}

func (a *applier) getRecord(ctx context.Context, name string) (Record, *corev1.ConfigMap, error) {
	cm, err := a.kube.CoreV1().ConfigMaps(RecordNamespace).Get(ctx, RecordName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Record{File: name}, nil, nil
	} else if err != nil {
		return Record{}, nil, err
	}
	rec, err := RecordFromData(cm.Data)
	if err != nil || rec.File != name {
		// Not a record this package wrote for this file: start afresh, and overwrite it.
		a.log.Warn("a manifest's record is unreadable; starting it afresh", "file", name, "configmap", cm.Name, "error", err)
		return Record{File: name}, cm, nil
	}
	return rec, cm, nil
}

// putRecord creates or updates a file's record; an unchanged record is not written.
func (a *applier) putRecord(ctx context.Context, name string, rec Record, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
	rec.File = name
	data := rec.Data()
	cms := a.kube.CoreV1().ConfigMaps(RecordNamespace)
	if cm == nil {
		created, err := cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: RecordName(name), Namespace: RecordNamespace, Labels: map[string]string{RecordLabel: "true"}},
			Data:       data,
		}, metav1.CreateOptions{FieldManager: FieldManager})
		if err != nil {
			return nil, fmt.Errorf("recording %s: %w", name, err)
		}
		return created, nil
	}
	if apiequality.Semantic.DeepEqual(cm.Data, data) {
		return cm, nil
	}
	next := cm.DeepCopy()
	next.Data = data
	if next.Labels == nil {
		next.Labels = map[string]string{}
	}
	next.Labels[RecordLabel] = "true"
	updated, err := cms.Update(ctx, next, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return cm, fmt.Errorf("recording %s: %w", name, err)
	}
	return updated, nil
}

// event reports on a file's record (or, before it exists, on a reference to the name it will have).
func (a *applier) event(name string, cm *corev1.ConfigMap, eventType, reason, format string, args ...any) {
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: RecordNamespace, Name: RecordName(name)}
	if cm != nil {
		ref.UID, ref.ResourceVersion = cm.UID, cm.ResourceVersion
	}
	a.recorder.Eventf(ref, eventType, reason, format, args...)
}
