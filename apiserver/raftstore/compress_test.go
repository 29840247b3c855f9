package raftstore

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"

	"github.com/skiff-dev/skiff/fsm"
)

// bigPod has labels enough that its stored form is worth compressing.
func bigPod(name string) *example.Pod {
	labels := map[string]string{}
	for _, k := range []string{"app", "tier", "team", "release", "track", "zone"} {
		labels["example.com/"+k] = strings.Repeat(k, 8)
	}
	return &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels},
		Spec: example.PodSpec{NodeName: "node-1", Hostname: name, Subdomain: "sub"}}
}

// stored returns what the Raft store holds for an object of s.
func stored(t *testing.T, e *testEnv, s *Store, key string) []byte {
	t.Helper()
	key, err := s.prepareKey(key, false)
	if err != nil {
		t.Fatal(err)
	}
	kv, _, err := e.backend.Store().Get(key)
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	return kv.Value
}

// TestValuesStoredCompressed: a resource's values are compressed in the store and read back as written,
// through a create, an update and a watch; a value stored uncompressed (before compression, or too small)
// still reads.
func TestValuesStoredCompressed(t *testing.T) {
	ctx, s, e := testSetup(t)
	w, err := s.Watch(ctx, "/pods/ns/", storage.ListOptions{ResourceVersion: "0", Predicate: storage.Everything, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	out := &example.Pod{}
	if err := s.Create(ctx, "/pods/ns/a", bigPod("a"), out, 0); err != nil {
		t.Fatal(err)
	}
	plain, err := runtime.Encode(s.codec, bigPod("a"))
	if err != nil {
		t.Fatal(err)
	}
	if v := stored(t, e, s, "/pods/ns/a"); !bytes.HasPrefix(v, zstdMagic) || len(v) >= len(plain) {
		t.Fatalf("stored as %d bytes starting %q; want zstd, smaller than the %d bytes encoded", len(v), v[:min(8, len(v))], len(plain))
	}
	if err := s.GuaranteedUpdate(ctx, "/pods/ns/a", &example.Pod{}, false, nil, storage.SimpleUpdate(func(obj runtime.Object) (runtime.Object, error) {
		obj.(*example.Pod).Spec.NodeName = "node-2"
		return obj, nil
	}), nil); err != nil {
		t.Fatal(err)
	}
	got := &example.Pod{}
	if err := s.Get(ctx, "/pods/ns/a", storage.GetOptions{}, got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "node-2" || got.Labels["example.com/app"] != strings.Repeat("app", 8) {
		t.Fatalf("read back %+v", got)
	}
	for i, want := range []string{"node-1", "node-2"} {
		ev := <-w.ResultChan()
		if pod, ok := ev.Object.(*example.Pod); !ok || pod.Spec.NodeName != want {
			t.Fatalf("watch event %d: %v %#v, want the pod on %s", i, ev.Type, ev.Object, want)
		}
	}

	// A value written before compression, straight into the store.
	key, _ := s.prepareKey("/pods/ns/old", false)
	if _, err := e.backend.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: mustEncode(t, s, bigPod("old"))}); err != nil {
		t.Fatal(err)
	}
	if err := s.Get(ctx, "/pods/ns/old", storage.GetOptions{}, got); err != nil || got.Name != "old" {
		t.Fatalf("an uncompressed value: %v, %+v", err, got)
	}
}

func mustEncode(t *testing.T, s *Store, obj runtime.Object) []byte {
	t.Helper()
	b, err := runtime.Encode(s.codec, obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEncryptedAndSecretValuesNotCompressed: an encrypted value is stored as the provider wrote it, and a
// Secret as the codec (or the provider) wrote it: the servers' key rotation reads Secrets' stored form.
func TestEncryptedAndSecretValuesNotCompressed(t *testing.T) {
	ctx, s, e := testSetup(t)
	s.SetTransformer(storagetesting.NewPrefixTransformer([]byte("k8s:enc:test:v1:"), false))
	if err := s.Create(ctx, "/pods/ns/enc", bigPod("enc"), &example.Pod{}, 0); err != nil {
		t.Fatal(err)
	}
	if v := stored(t, e, s, "/pods/ns/enc"); !bytes.HasPrefix(v, []byte("k8s:enc:test:v1:")) {
		t.Fatalf("an encrypted value is stored as %q", v[:min(16, len(v))])
	}

	secrets := New(Config{
		Backend: e.backend, Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion),
		Prefix: "/registry", ResourcePrefix: "/secrets/", GroupResource: schema.GroupResource{Resource: "secrets"},
		NewFunc: func() runtime.Object { return &example.Pod{} }, NewListFunc: func() runtime.Object { return &example.PodList{} },
	})
	if err := secrets.Create(ctx, "/secrets/ns/s", bigPod("s"), &example.Pod{}, 0); err != nil {
		t.Fatal(err)
	}
	if v := stored(t, e, secrets, "/secrets/ns/s"); !bytes.Equal(v, mustEncode(t, secrets, bigPod("s"))) {
		t.Fatalf("a Secret is stored as %q", v[:min(16, len(v))])
	}
}

// TestCorruptCompressedValue: a compressed value that does not decompress is an internal error, not a panic
// or an empty object.
func TestCorruptCompressedValue(t *testing.T) {
	ctx, s, e := testSetup(t)
	key, _ := s.prepareKey("/pods/ns/bad", false)
	bad := append(append([]byte(nil), zstdMagic...), "not a zstd frame"...)
	if _, err := e.backend.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: bad}); err != nil {
		t.Fatal(err)
	}
	err := s.Get(context.Background(), "/pods/ns/bad", storage.GetOptions{}, &example.Pod{})
	if !storage.IsInternalError(err) || !strings.Contains(err.Error(), "decompressing") {
		t.Fatalf("reading a corrupt value: %v; want an internal error", err)
	}
}
