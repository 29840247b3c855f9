package raftstore

import (
	"bytes"
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"

	"github.com/skiff-dev/skiff/fsm"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// These tests run the library's own storage conformance suite (k8s.io/apiserver/pkg/storage/testing, the
// suite etcd3's store passes) against the Raft store, on a real one-peer Raft cluster.

var scheme = runtime.NewScheme()
var codecs = serializer.NewCodecFactory(scheme)

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
}

type testEnv struct {
	backend Backend
}

func testSetup(t *testing.T) (context.Context, *Store, *testEnv) {
	t.Helper()
	c := rt.TestCluster(t, 1)
	env := &testEnv{backend: c.Node(0)}
	s := New(Config{
		Backend: env.backend, Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion),
		Prefix: "/registry", ResourcePrefix: "/pods/", GroupResource: schema.GroupResource{Resource: "pods"},
		NewFunc: func() runtime.Object { return &example.Pod{} }, NewListFunc: func() runtime.Object { return &example.PodList{} },
	})
	return context.Background(), s, env
}

// increaseRV writes an unrelated key, as the etcd3 tests do, and returns the new revision.
func (e *testEnv) increaseRV(ctx context.Context, t *testing.T) int64 {
	res, err := e.backend.Apply(ctx, &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: "/increaseRV", Value: []byte("ok")}}}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Revision
}

// compact compacts the store's history up to the given resourceVersion.
func (e *testEnv) compact(ctx context.Context, t *testing.T, resourceVersion string) {
	rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.backend.Apply(ctx, &fsm.Command{Type: fsm.CmdCompact, CompactRevision: int64(rv)}); err != nil {
		t.Fatal(err)
	}
}

func noValidation(ctx context.Context, t *testing.T, key string) {}

func TestCreate(t *testing.T) {
	ctx, s, _ := testSetup(t)
	storagetesting.RunTestCreate(ctx, t, s, noValidation)
}

func TestCreateWithTTL(t *testing.T) {
	ctx, s, _ := testSetup(t)
	storagetesting.RunTestCreateWithTTL(ctx, t, s)
}

func TestCreateWithKeyExist(t *testing.T) {
	ctx, s, _ := testSetup(t)
	storagetesting.RunTestCreateWithKeyExist(ctx, t, s)
}

func TestGet(t *testing.T) {
	ctx, s, _ := testSetup(t)
	storagetesting.RunTestGet(ctx, t, s)
}

func TestDeletes(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(context.Context, *testing.T, storage.Interface)
	}{
		{"Unconditional", storagetesting.RunTestUnconditionalDelete},
		{"Conditional", storagetesting.RunTestConditionalDelete},
		{"WithSuggestion", storagetesting.RunTestDeleteWithSuggestion},
		{"WithSuggestionAndConflict", storagetesting.RunTestDeleteWithSuggestionAndConflict},
		{"WithSuggestionOfDeletedObject", storagetesting.RunTestDeleteWithSuggestionOfDeletedObject},
		{"ValidateDeletionWithSuggestion", storagetesting.RunTestValidateDeletionWithSuggestion},
		{"ValidateDeletionWithOnlySuggestionValid", storagetesting.RunTestValidateDeletionWithOnlySuggestionValid},
		{"WithConflict", storagetesting.RunTestDeleteWithConflict},
		{"PreconditionalWithSuggestion", storagetesting.RunTestPreconditionalDeleteWithSuggestion},
		{"PreconditionalWithOnlySuggestionPass", storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, s, _ := testSetup(t)
			tc.run(ctx, t, s)
		})
	}
}

func TestGuaranteedUpdates(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(context.Context, *testing.T, storage.Interface)
	}{
		{"WithTTL", storagetesting.RunTestGuaranteedUpdateWithTTL},
		{"WithConflict", storagetesting.RunTestGuaranteedUpdateWithConflict},
		{"WithSuggestionAndConflict", storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, s, _ := testSetup(t)
			tc.run(ctx, t, s)
		})
	}
}

func TestLists(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(context.Context, *testing.T, *Store, *testEnv)
	}{
		{"Paging", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestListPaging(ctx, t, s)
		}},
		{"NonRecursive", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestGetListNonRecursive(ctx, t, e.increaseRV, s)
		}},
		{"RecursivePrefix", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestGetListRecursivePrefix(ctx, t, s)
		}},
		{"KeySchema", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestKeySchema(ctx, t, s)
		}},
		{"List", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestList(ctx, t, s, e.compact, false, nil)
		}},
		{"ConsistentList", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestConsistentList(ctx, t, s, e.increaseRV, false, true, false)
		}},
		{"CompactRevision", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestCompactRevision(ctx, t, s, e.increaseRV, e.compact)
		}},
		{"Continuation", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestListContinuation(ctx, t, s, nil)
		}},
		{"PaginationRareObject", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestListPaginationRareObject(ctx, t, s, nil)
		}},
		{"ContinuationWithFilter", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestListContinuationWithFilter(ctx, t, s, nil)
		}},
		{"InconsistentContinuation", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestListInconsistentContinuation(ctx, t, s, e.compact)
		}},
		{"NamespaceScoped", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestNamespaceScopedList(ctx, t, s)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, s, e := testSetup(t)
			tc.run(ctx, t, s, e)
		})
	}
}

func TestWatches(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(context.Context, *testing.T, *Store, *testEnv)
	}{
		{"Watch", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) { storagetesting.RunTestWatch(ctx, t, s) }},
		{"ClusterScoped", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestClusterScopedWatch(ctx, t, s)
		}},
		{"NamespaceScoped", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestNamespaceScopedWatch(ctx, t, s)
		}},
		{"DeleteTriggers", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestDeleteTriggerWatch(ctx, t, s)
		}},
		{"FromZero", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestWatchFromZero(ctx, t, s, e.compact)
		}},
		{"FromNonZero", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestWatchFromNonZero(ctx, t, s)
		}},
		{"DelayedDelivery", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestDelayedWatchDelivery(ctx, t, s)
		}},
		{"ContextCancel", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestWatchContextCancel(ctx, t, s)
		}},
		{"WatcherTimeout", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestWatcherTimeout(ctx, t, s)
		}},
		{"DeleteEventObjectHaveLatestRV", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(ctx, t, s)
		}},
		{"InitializationSignal", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestWatchInitializationSignal(ctx, t, s)
		}},
		{"ProgressNotify", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunOptionalTestProgressNotify(ctx, t, s, e.increaseRV)
		}},
		{"DispatchBookmarkEvents", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, s, false)
		}},
		{"SendInitialEventsBackwardCompatibility", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunSendInitialEventsBackwardCompatibility(ctx, t, s)
		}},
		{"Semantics", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunWatchSemantics(ctx, t, s)
		}},
		{"SemanticInitialEventsExtended", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunWatchSemanticInitialEventsExtended(ctx, t, s)
		}},
		{"ListMatchSingle", func(ctx context.Context, t *testing.T, s *Store, e *testEnv) {
			storagetesting.RunWatchListMatchSingle(ctx, t, s)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, s, e := testSetup(t)
			tc.run(ctx, t, s, e)
		})
	}
}

func TestStats(t *testing.T) {
	ctx, s, _ := testSetup(t)
	storagetesting.RunTestStats(ctx, t, s, apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion), identity.NewEncryptCheckTransformer(), false)
}

// The suite's transformer tests run the store under a prefix transformer, as etcd3's do: a value that does
// not carry the prefix fails to read, and one read through a stale transformer is rewritten on update.
const testPrefix = "test!"

type storeWithPrefixTransformer struct {
	*Store
	current *storagetesting.PrefixTransformer
}

func withPrefixTransformer(s *Store) *storeWithPrefixTransformer {
	p := storagetesting.NewPrefixTransformer([]byte(testPrefix), false)
	s.SetTransformer(p)
	return &storeWithPrefixTransformer{Store: s, current: p}
}

func (s *storeWithPrefixTransformer) UpdatePrefixTransformer(modifier storagetesting.PrefixTransformerModifier) func() {
	original := s.current
	changed := *original
	s.SetTransformer(modifier(&changed))
	return func() { s.SetTransformer(original) }
}

// storedWithPrefix checks that what the store holds for key is the prefix, then the object without a
// resourceVersion.
func storedWithPrefix(e *testEnv, s *Store) storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		value, err := decompressValue(stored(t, e, s, key)) // the test's prefix is no encryption: the value may be compressed
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(value, []byte(testPrefix)) {
			t.Fatalf("%s is stored without the transformer's prefix: %q", key, value)
		}
		obj, err := runtime.Decode(s.codec, value[len(testPrefix):])
		if err != nil {
			t.Fatalf("decoding %s: %v", key, err)
		}
		if obj.(*example.Pod).ResourceVersion != "" {
			t.Errorf("%s is stored with a resourceVersion", key)
		}
	}
}

func TestTransformers(t *testing.T) {
	t.Run("GuaranteedUpdate", func(t *testing.T) {
		ctx, s, e := testSetup(t)
		storagetesting.RunTestGuaranteedUpdate(ctx, t, withPrefixTransformer(s), storedWithPrefix(e, s))
	})
	t.Run("GuaranteedUpdateChecksStoredData", func(t *testing.T) {
		ctx, s, _ := testSetup(t)
		storagetesting.RunTestGuaranteedUpdateChecksStoredData(ctx, t, withPrefixTransformer(s))
	})
	t.Run("TransformationFailure", func(t *testing.T) {
		ctx, s, _ := testSetup(t)
		storagetesting.RunTestTransformationFailure(ctx, t, withPrefixTransformer(s))
	})
}
