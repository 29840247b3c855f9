package controller

import (
	"context"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestPCRCleaner: PodCertificateRequests older than a quarter of an hour are deleted, younger ones stay.
func TestPCRCleaner(t *testing.T) {
	now := time.Now()
	pcr := func(name string, age time.Duration) *certificatesv1.PodCertificateRequest {
		return &certificatesv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			CreationTimestamp: metav1.NewTime(now.Add(-age))}}
	}
	client := fake.NewClientset(pcr("old", 16*time.Minute), pcr("young", 14*time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory := informers.NewSharedInformerFactory(client, 0)
	run, err := buildPCRCleanerWith(clocktesting.NewFakePassiveClock(now))(ctx, &Clients{Kube: client, Informers: factory})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	done := make(chan struct{})
	go func() { defer close(done); run() }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := client.CertificatesV1().PodCertificateRequests("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 1 {
			if list.Items[0].Name != "young" {
				t.Fatalf("left %s; want young", list.Items[0].Name)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests left: %d; want only young", len(list.Items))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
