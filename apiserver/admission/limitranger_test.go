package admission

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

// A LimitRange the server's informer does not have yet (created a moment before the pod) still gives the pod
// its defaults: with no LimitRange in its informer for the namespace, the plugin looks the namespace's up live,
// once per 30 s, as Kubernetes' does. One the informer holds is used without a lookup.
func TestLimitRangerLooksUpLiveWhenItsInformerHasNone(t *testing.T) {
	lr := &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "defaults"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer,
			Default: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m")}}}}}
	client := fake.NewClientset(lr)
	factory := informers.NewSharedInformerFactory(client, 0)
	l := newLimitRanger(factory.Core().V1().LimitRanges().Lister(), client)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	lists := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "list" && a.GetResource().Resource == "limitranges" {
				n++
			}
		}
		return n
	}
	admit := func() string {
		t.Helper()
		pod := samplePod()
		if err := l.Admit(context.Background(), podAttrs(pod, nil, "CREATE", ""), nil); err != nil {
			t.Fatal(err)
		}
		if err := l.Validate(context.Background(), podAttrs(pod, nil, "CREATE", ""), nil); err != nil {
			t.Fatal(err)
		}
		return pod.Spec.Containers[0].Resources.Limits.Cpu().String()
	}

	if got := admit(); got != "200m" {
		t.Fatalf("container cpu limit %s, want the live LimitRange's default 200m", got)
	}
	if n := lists(); n != 1 {
		t.Fatalf("%d live lists for one pod (Admit and Validate), want 1", n)
	}
	now = now.Add(29 * time.Second)
	admit()
	if n := lists(); n != 1 {
		t.Fatalf("%d live lists within 30 s, want 1", n)
	}
	now = now.Add(2 * time.Second)
	admit()
	if n := lists(); n != 2 {
		t.Fatalf("%d live lists after 30 s, want 2", n)
	}
	// Once the informer has it, no lookup.
	if err := factory.Core().V1().LimitRanges().Informer().GetIndexer().Add(lr); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute)
	if got := admit(); got != "200m" || lists() != 2 {
		t.Fatalf("cpu limit %s and %d lists with the LimitRange in the informer, want 200m and 2", got, lists())
	}
}
