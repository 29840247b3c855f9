package apiserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestRequestBodyLimit checks that a body over 3 MiB gets 413 with a Status body, and nothing is stored.
func TestRequestBodyLimit(t *testing.T) {
	t.Parallel()
	peer := servertest.Shared(t)
	ns := servertest.Namespace(t, peer, "bodylimit")
	ctx := context.Background()
	client := peer.Client

	big := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "big"}, Data: map[string]string{"blob": strings.Repeat("x", 4<<20)}}
	_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, big, metav1.CreateOptions{})
	if !apierrors.IsRequestEntityTooLargeError(err) {
		t.Fatalf("4 MiB ConfigMap: got %v, want 413", err)
	}
	if status, ok := err.(apierrors.APIStatus); !ok || status.Status().Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("4 MiB ConfigMap: status %+v", err)
	}
	if _, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "big", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused ConfigMap was stored: %v", err)
	}
}

// TestInFlightLimit sends 64 concurrent writes as a node (system:masters is exempt from the limits) to a
// server that allows one write in flight: the excess gets 429 with Retry-After and a Status body, and only
// the acknowledged writes are stored.
func TestInFlightLimit(t *testing.T) {
	one := 1
	peers := servertest.StartWith(t, 1, func(f *config.ServerFile) {
		f.Server.MaxMutatingRequestsInFlight = &one
	})
	ctx := context.Background()
	nodeConfig := rest.AnonymousClientConfig(peers[0].Config)
	nodeConfig.CertFile = servertest.NodeClientCert(t, peers[0], "node-1")
	nodeConfig.KeyFile = nodeConfig.CertFile
	// Raw HTTP, because client-go retries 429s by itself.
	httpClient, err := rest.HTTPClientFor(nodeConfig)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	codes := map[int]int{}
	var tooMany *http.Response
	var tooManyBody []byte
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Events: a write a node may make.
			body, _ := json.Marshal(&corev1.Event{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
				ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("ev-%d", i)},
				InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node-1"}, Reason: "Test", Message: strings.Repeat("v", 10000)})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, nodeConfig.Host+"/api/v1/namespaces/default/events", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			codes[resp.StatusCode]++
			if resp.StatusCode == http.StatusTooManyRequests && tooMany == nil {
				tooMany, tooManyBody = resp, b
			}
		}()
	}
	wg.Wait()
	if tooMany == nil {
		t.Fatalf("64 concurrent writes with one allowed in flight: status codes %v, want some 429", codes)
	}
	if codes[http.StatusCreated]+codes[http.StatusTooManyRequests] != 64 {
		t.Fatalf("status codes %v, want only 201 and 429", codes)
	}
	if tooMany.Header.Get("Retry-After") == "" {
		t.Errorf("429 without Retry-After: %v", tooMany.Header)
	}
	var status metav1.Status
	if err := json.Unmarshal(tooManyBody, &status); err != nil || status.Kind != "Status" || status.Code != http.StatusTooManyRequests ||
		status.Reason != metav1.StatusReasonTooManyRequests {
		t.Errorf("429 body %s (%v)", tooManyBody, err)
	}
	list, err := peers[0].Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for _, ev := range list.Items {
		if strings.HasPrefix(ev.Name, "ev-") {
			stored++
		}
	}
	if stored != codes[http.StatusCreated] {
		t.Errorf("%d Events stored, %d creates acknowledged", stored, codes[http.StatusCreated])
	}
}
