package apiserver_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/apiserver"
)

// TestEventSourceFieldSelector: core/v1's source= field selector matches an event's source component, and
// the reporting controller of an event written through events.k8s.io/v1 (which has no source), as on
// kube-apiserver.
func TestEventSourceFieldSelector(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "events")
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	now := metav1.NewMicroTime(time.Now())
	if _, err := client.EventsV1().Events(ns).Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "new-style"}, EventTime: now, ReportingController: "example.com/ctl",
		ReportingInstance: "ctl-1", Action: "Test", Reason: "Testing", Type: corev1.EventTypeNormal,
		Regarding: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "p"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Events(ns).Create(ctx, &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "old-style"}, Source: corev1.EventSource{Component: "kubelet"}, Reason: "Testing",
		Type: corev1.EventTypeNormal, InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "p"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for selector, want := range map[string]string{"source=example.com/ctl": "new-style", "source=kubelet": "old-style"} {
		list, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 || list.Items[0].Name != want {
			t.Errorf("%s: %d events; want only %s", selector, len(list.Items), want)
		}
	}

	// events.k8s.io/v1 selects with its own field names, which Kubernetes maps to the core Event's.
	for selector, want := range map[string][]string{
		"reportingController=example.com/ctl": {"new-style"},
		"regarding.name=p,type=Normal":        {"new-style", "old-style"},
		"reason=Other":                        nil,
	} {
		list, err := client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			t.Fatalf("events.k8s.io %s: %v", selector, err)
		}
		var got []string
		for _, e := range list.Items {
			got = append(got, e.Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("events.k8s.io %s: %v; want %v", selector, got, want)
		}
	}
	// A core field name is not one of events.k8s.io's: 400, as on kube-apiserver.
	_, err := client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "source=kubelet"})
	if !apierrors.IsBadRequest(err) {
		t.Errorf("events.k8s.io source=: %v; want 400", err)
	}
}
