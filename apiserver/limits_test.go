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
	"time"

	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/proctest"
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

// TestPriorityLevelRejects: API Priority and Fairness refuses what a priority level cannot take. A
// PriorityLevelConfiguration with one seat and limitResponse Reject, and a FlowSchema sending a node's
// requests to it; 64 concurrent writes as that node (system:masters is exempt): the excess gets 429 with
// Retry-After and a Status body, and only the acknowledged writes are stored.
func TestPriorityLevelRejects(t *testing.T) {
	one := 1
	peers := servertest.StartWith(t, 1, func(f *config.ServerFile) {
		f.Server.MaxRequestsInFlight, f.Server.MaxMutatingRequestsInFlight = &one, &one
	})
	ctx := context.Background()
	nodeConfig := rest.AnonymousClientConfig(peers[0].Config)
	nodeConfig.CertFile = servertest.NodeClientCert(t, peers[0], "node-1")
	nodeConfig.KeyFile = nodeConfig.CertFile
	fc := peers[0].Client.FlowcontrolV1()
	shares := int32(1)
	if _, err := fc.PriorityLevelConfigurations().Create(ctx, &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "tiny"}, Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited, Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: &shares, LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	schema, err := fc.FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: "node-1-tiny"},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "tiny"},
			MatchingPrecedence: 100, Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "system:node:node-1"}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"},
					ClusterScope: true, Namespaces: []string{"*"}}},
			}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Raw HTTP, because client-go retries 429s by itself.
	httpClient, err := rest.HTTPClientFor(nodeConfig)
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "node-1's requests classified by node-1-tiny", 30*time.Second, func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, nodeConfig.Host+"/api/v1/namespaces/default/events", nil)
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID"); got != string(schema.UID) {
			return fmt.Errorf("classified by %q", got)
		}
		return nil
	})
	// Bursts of 64 writes, each released at once, until one overlaps enough to find the seat taken: on a
	// starved machine the requests of one burst can reach the server one after another.
	var mu sync.Mutex
	codes := map[int]int{}
	var tooMany *http.Response
	var tooManyBody []byte
	sent := 0
	for burst := 0; burst < 3 && tooMany == nil; burst++ {
		bodies := make([][]byte, 64)
		for i := range bodies {
			// Events: a write a node may make.
			bodies[i], _ = json.Marshal(&corev1.Event{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
				ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("ev-%d-%d", burst, i)},
				InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node-1"}, Reason: "Test", Message: strings.Repeat("v", 10000)})
		}
		release := make(chan struct{})
		var wg sync.WaitGroup
		for _, body := range bodies {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, nodeConfig.Host+"/api/v1/namespaces/default/events", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				<-release
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
			})
		}
		close(release)
		wg.Wait()
		sent += len(bodies)
	}
	if tooMany == nil {
		t.Fatalf("%d concurrent writes in bursts of 64 to a level of one seat that rejects: status codes %v, want some 429", sent, codes)
	}
	if codes[http.StatusCreated]+codes[http.StatusTooManyRequests] != sent {
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
