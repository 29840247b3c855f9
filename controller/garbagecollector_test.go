package controller

import (
	"context"
	"testing"

	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/metadata"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"
)

// preferredDiscovery is the fake discovery with ServerPreferredResources answered from its resource lists
// (client-go's fake answers nothing).
type preferredDiscovery struct{ *fakediscovery.FakeDiscovery }

func (d preferredDiscovery) ServerPreferredResources() ([]*metav1.APIResourceList, error) {
	return d.Resources, nil
}

// lagging is a metadata client whose watch cache of one resource lags: a list at resourceVersion "0"
// finds none of its objects, as a cache that has not yet seen them would answer.
type lagging struct {
	metadata.Interface
	resource schema.GroupVersionResource
}

func (l lagging) Resource(r schema.GroupVersionResource) metadata.Getter {
	if r != l.resource {
		return l.Interface.Resource(r)
	}
	return laggingResource{l.Interface.Resource(r)}
}

type laggingResource struct{ metadata.Getter }

func (l laggingResource) List(ctx context.Context, opts metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
	if opts.ResourceVersion == "0" {
		return &metav1.PartialObjectMetadataList{}, nil
	}
	return l.Getter.List(ctx, opts)
}

// The cached pod list predates a pod that names a Job as owner, and the Job is already being deleted with
// the orphan finalizer: the collector must orphan that pod before it lets the Job go, or the pod would be
// collected as the dependent of a Job that no longer exists.
func TestGarbageCollectorOrphansWhatTheCacheHasNotSeen(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	job := &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "j", UID: "job-uid", ResourceVersion: "5",
			DeletionTimestamp: &now, Finalizers: []string{metav1.FinalizerOrphanDependents}},
	}
	pod := &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", UID: "pod-uid", ResourceVersion: "4",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "j", UID: "job-uid"}}},
	}
	meta := metadatafake.NewSimpleMetadataClient(scheme, job, pod)
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	jobs := schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}
	verbs := metav1.Verbs{"list", "delete", "patch", "get"}
	disc := preferredDiscovery{&fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods", Kind: "Pod", Namespaced: true, Verbs: verbs}}},
		{GroupVersion: "batch/v1", APIResources: []metav1.APIResource{{Name: "jobs", Kind: "Job", Namespaced: true, Verbs: verbs}}},
	}}}}
	c := &Clients{Metadata: lagging{meta, pods}, Discovery: disc, Logger: hclog.NewNullLogger()}

	ctx := context.Background()
	if err := gcRound(ctx, c); err != nil {
		t.Fatal(err)
	}
	p, err := meta.Resource(pods).Namespace("default").Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pod: %v", err)
	}
	if len(p.OwnerReferences) != 0 {
		t.Fatalf("the pod still names its owner: %v", p.OwnerReferences)
	}
	j, err := meta.Resource(jobs).Namespace("default").Get(ctx, "j", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the job: %v", err)
	}
	if len(j.Finalizers) != 0 {
		t.Fatalf("the job's finalizers after orphaning: %v", j.Finalizers)
	}
}
