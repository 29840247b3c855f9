package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/servertest"
	"github.com/skiff-dev/skiff/manifests"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// appliedWithin is how soon after a file is written its objects must exist (issue 33's acceptance).
const appliedWithin = 2 * time.Second

// TestManifestsFolder: on three servers, each with its own copy of the manifests folder, a file dropped in is
// applied within 2 s (labelled, under the skiff-manifests field manager), a change is applied again and what
// the file no longer holds is deleted, a removed file's objects are deleted, and a file that does not parse or
// that the API refuses in part is an Event on its record while the other files apply; an object moved to
// another file is not deleted by the file it left. Then the leader stops,
// and the new leader, which has only its own folder and the records in the cluster, goes on: a new file is
// applied, and what a file dropped, or a removed file had, is deleted; nothing is left twice or orphaned.
func TestManifestsFolder(t *testing.T) {
	var dirs []string
	peers := servertest.StartWith(t, 3, func(f *config.ServerFile) {
		dirs = append(dirs, filepath.Join(*f.DataDir, "manifests"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	live := map[int]bool{0: true, 1: true, 2: true}
	// put and remove change a file in every running server's folder, as an operator keeps them the same; a
	// write is a rename, as editors and configuration tools do, so that no server reads half a file.
	put := func(name, body string) time.Time {
		t.Helper()
		for i := range dirs {
			if !live[i] {
				continue
			}
			tmp := filepath.Join(dirs[i], "."+name+".tmp")
			if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dirs[i], name)); err != nil {
				t.Fatal(err)
			}
		}
		return time.Now()
	}
	remove := func(name string) {
		t.Helper()
		for i := range dirs {
			if live[i] {
				if err := os.Remove(filepath.Join(dirs[i], name)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	client := peers[0].Client
	cm := func(ns, name string) (*corev1.ConfigMap, error) {
		return client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	}
	hasData := func(ns, name, key, value string) func() error {
		return func() error {
			c, err := cm(ns, name)
			if err != nil {
				return err
			}
			if c.Data[key] != value {
				return fmt.Errorf("%s/%s: %s=%q, want %q", ns, name, key, c.Data[key], value)
			}
			return nil
		}
	}
	gone := func(ns, name string) func() error {
		return func() error {
			if _, err := cm(ns, name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s/%s: %v, want NotFound", ns, name, err)
			}
			return nil
		}
	}
	all := func(conds ...func() error) func() error {
		return func() error {
			for _, c := range conds {
				if err := c(); err != nil {
					return err
				}
			}
			return nil
		}
	}
	// term is the highest Raft term the running servers know: it moves when a leader is elected.
	term := func() uint64 {
		var highest uint64
		for i, p := range peers {
			if live[i] {
				highest = max(highest, p.Server.Node().Stats()["term"])
			}
		}
		return highest
	}
	// within polls until cond holds, and fails if that took longer than appliedWithin (it polls on, up to a
	// minute, to say how long it took) under one leader: an election in the window (the servers' CPU starved
	// by a loaded machine, with the tests' short Raft timeouts) makes the time one of failover, logged only.
	within := func(what string, since time.Time, termBefore uint64, cond func() error) {
		t.Helper()
		rt.WaitFor(t, what, time.Minute, cond)
		took := time.Since(since).Round(time.Millisecond)
		switch after := term(); {
		case after != termBefore:
			t.Logf("%s in %v, across an election (term %d to %d): the %v bound is not checked", what, took, termBefore, after, appliedWithin)
		case took > appliedWithin:
			t.Fatalf("%s took %v, more than %v", what, took, appliedWithin)
		default:
			t.Logf("%s in %v", what, took)
		}
	}

	// 0. The cluster settles first: the timings below are of a running cluster's leader, not of one whose
	// controllers are still starting (kube-root-ca.crt is published once they run), and of an applier that
	// has started (a first file applied).
	rt.WaitFor(t, "the controllers to run", time.Minute, func() error { _, err := cm("default", "kube-root-ca.crt"); return err })
	put("warmup.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: warmup}\n")
	rt.WaitFor(t, "a first file applied", time.Minute, func() error { _, err := cm("default", "warmup"); return err })
	remove("warmup.yaml")
	rt.WaitFor(t, "the first file's object deleted", time.Minute, gone("default", "warmup"))

	// 1. A new file: a namespace and two ConfigMaps, one without a namespace (default).
	t0 := term()
	start := put("web.yaml", `apiVersion: v1
kind: ConfigMap
metadata:
  name: cm-a
  namespace: mf
data: {v: "1"}
---
apiVersion: v1
kind: Namespace
metadata:
  name: mf
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm-b
data: {v: "1"}
`)
	within("web.yaml applied", start, t0, all(hasData("mf", "cm-a", "v", "1"), hasData("default", "cm-b", "v", "1")))
	a, err := cm("mf", "cm-a")
	if err != nil {
		t.Fatal(err)
	}
	if a.Labels[manifests.FileLabel] != "web.yaml" || a.Annotations[manifests.FileAnnotation] != "web.yaml" {
		t.Fatalf("cm-a is not labelled with its file: %v %v", a.Labels, a.Annotations)
	}
	var managers []string
	for _, f := range a.ManagedFields {
		managers = append(managers, f.Manager+"/"+string(f.Operation))
	}
	if strings.Join(managers, ",") != manifests.FieldManager+"/Apply" {
		t.Fatalf("cm-a's field managers: %v", managers)
	}

	// 2. The file changes: cm-a again, cm-b leaves the file, cm-c joins it.
	t0 = term()
	start = put("web.yaml", `apiVersion: v1
kind: Namespace
metadata:
  name: mf
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm-a
  namespace: mf
data: {v: "2"}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm-c
  namespace: mf
data: {v: "1"}
`)
	within("web.yaml re-applied", start, t0, all(hasData("mf", "cm-a", "v", "2"), hasData("mf", "cm-c", "v", "1"), gone("default", "cm-b")))

	// 3. A file that does not parse, and one the API refuses in part, beside a good one.
	t0 = term()
	start = put("bad.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x\n")
	put("refused.yaml", `apiVersion: v1
kind: ConfigMap
metadata: {name: refused-good}
data: {v: "1"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: Not_A_Name}
`)
	put("good.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: good-1}\ndata: {v: \"1\"}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: good-2}\ndata: {v: \"1\"}\n")
	within("good.yaml and refused.yaml's good object applied", start, t0, all(hasData("default", "good-1", "v", "1"), hasData("default", "refused-good", "v", "1")))
	event := func(file, reason string) func() error {
		return func() error {
			list, err := client.CoreV1().Events(manifests.RecordNamespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, e := range list.Items {
				if e.InvolvedObject.Kind == "ConfigMap" && e.InvolvedObject.Name == manifests.RecordName(file) && e.Reason == reason &&
					e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, file) {
					t.Logf("event %s: %s", e.Reason, e.Message)
					return nil
				}
			}
			return fmt.Errorf("no %s event for %s among %d", reason, file, len(list.Items))
		}
	}
	rt.WaitFor(t, "the bad files' events", 30*time.Second, all(event("bad.yaml", "ParseFailed"), event("refused.yaml", "ApplyFailed")))

	// 3b. An object moved to another file is not deleted by the file it left: good-2 goes to moved.yaml, and
	// good.yaml, re-applied without it, leaves it be.
	put("moved.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: good-2}\ndata: {v: moved}\n")
	rt.WaitFor(t, "good-2 taken over by moved.yaml", 30*time.Second, hasData("default", "good-2", "v", "moved"))
	put("good.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: good-1}\ndata: {v: \"2\"}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: good-3}\ndata: {v: \"1\"}\n")
	rt.WaitFor(t, "good.yaml's record without good-2", 30*time.Second, func() error {
		rec, err := cm(manifests.RecordNamespace, manifests.RecordName("good.yaml"))
		if err != nil {
			return err
		}
		if objs := rec.Data["objects"]; strings.Contains(objs, "good-2") || !strings.Contains(objs, "good-3") {
			return fmt.Errorf("good.yaml's record lists %s", objs)
		}
		return nil
	})
	if err := hasData("default", "good-2", "v", "moved")(); err != nil {
		t.Fatalf("good-2, moved to moved.yaml, after good.yaml dropped it: %v", err)
	}

	// 4. A removed file's objects go.
	remove("refused.yaml")
	rt.WaitFor(t, "refused.yaml's object deleted", 30*time.Second, gone("default", "refused-good"))

	// 5. The leader stops; a new one takes over with its own folder and the records.
	leader := -1
	for i, p := range peers {
		if p.Server.Node().IsLeader() {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no leader")
	}
	peers[leader].Server.Shutdown()
	live[leader] = false
	var others []int
	for i := range peers {
		if live[i] {
			others = append(others, i)
		}
	}
	client = peers[others[0]].Client
	rt.WaitFor(t, "a new leader", 30*time.Second, func() error {
		for _, i := range others {
			if peers[i].Server.Node().IsLeader() {
				return nil
			}
		}
		return fmt.Errorf("no leader among %v", others)
	})
	start = put("late.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: late}\ndata: {v: \"1\"}\n")
	rt.WaitFor(t, "late.yaml applied by the new leader", time.Minute, hasData("default", "late", "v", "1"))
	t.Logf("late.yaml applied %v after it was written, across the leader change", time.Since(start).Round(time.Millisecond))
	// Once it leads, the new leader applies a new file within the same bound.
	t0 = term()
	start = put("later.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: later}\ndata: {v: \"1\"}\n")
	within("later.yaml applied by the new leader", start, t0, hasData("default", "later", "v", "1"))
	// What a file dropped, and what a removed file held, recorded by the old leader, is deleted by the new one.
	put("good.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: good-1}\ndata: {v: \"3\"}\n")
	remove("web.yaml")
	remove("bad.yaml")
	remove("moved.yaml")
	rt.WaitFor(t, "the old leader's objects deleted by the new one", time.Minute, all(gone("default", "good-3"), gone("default", "good-2"), hasData("default", "good-1", "v", "3"),
		gone("mf", "cm-a"), gone("mf", "cm-c"), func() error {
			ns, err := client.CoreV1().Namespaces().Get(ctx, "mf", metav1.GetOptions{})
			if err == nil && ns.DeletionTimestamp == nil {
				return fmt.Errorf("namespace mf is not being deleted")
			} else if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			return nil
		}))

	// Nothing twice, nothing orphaned: the objects the files label, and the records, are exactly the files'.
	rt.WaitFor(t, "exactly the files' objects and records", 30*time.Second, func() error {
		objs, err := labelled(ctx, client)
		if err != nil {
			return err
		}
		if want := "default/good-1=good.yaml,default/late=late.yaml,default/later=later.yaml"; objs != want {
			return fmt.Errorf("labelled ConfigMaps %s, want %s", objs, want)
		}
		recs, err := client.CoreV1().ConfigMaps(manifests.RecordNamespace).List(ctx, metav1.ListOptions{LabelSelector: manifests.RecordLabel})
		if err != nil {
			return err
		}
		var names []string
		for _, r := range recs.Items {
			names = append(names, r.Name+"="+r.Data["error"])
		}
		sort.Strings(names)
		if got, want := strings.Join(names, ","), "skiff-manifest-good.yaml=,skiff-manifest-late.yaml=,skiff-manifest-later.yaml="; got != want {
			return fmt.Errorf("records %s, want %s", got, want)
		}
		return nil
	})
}

// labelled lists the ConfigMaps carrying a manifest label, as namespace/name=file, sorted.
func labelled(ctx context.Context, client kubernetes.Interface) (string, error) {
	list, err := client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: manifests.FileLabel})
	if err != nil {
		return "", err
	}
	var out []string
	for _, c := range list.Items {
		out = append(out, c.Namespace+"/"+c.Name+"="+c.Annotations[manifests.FileAnnotation])
	}
	sort.Strings(out)
	return strings.Join(out, ","), nil
}
