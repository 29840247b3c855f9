package apiserver_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestRequestBodyLimit checks that a body over 3 MiB gets 413 with a Status body, and nothing is stored.
// (The in-flight limits' 429 cannot be shown yet: as in Kubernetes, system:masters, the only identity there
// is until node and service-account credentials arrive, is exempt from them.)
func TestRequestBodyLimit(t *testing.T) {
	peers := servertest.Start(t, 1)
	ctx := context.Background()
	client := peers[0].Client

	big := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "big"}, Data: map[string]string{"blob": strings.Repeat("x", 4<<20)}}
	_, err := client.CoreV1().ConfigMaps("default").Create(ctx, big, metav1.CreateOptions{})
	if !apierrors.IsRequestEntityTooLargeError(err) {
		t.Fatalf("4 MiB ConfigMap: got %v, want 413", err)
	}
	if status, ok := err.(apierrors.APIStatus); !ok || status.Status().Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("4 MiB ConfigMap: status %+v", err)
	}
	if _, err := client.CoreV1().ConfigMaps("default").Get(ctx, "big", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused ConfigMap was stored: %v", err)
	}
}
