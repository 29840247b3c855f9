package apiserver

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/raftnode"
)

// lostAnswerBackend commits every write, but while lose is set it answers as a leader that lost its
// leadership before it learned the outcome: raftnode.ErrUnknownOutcome.
type lostAnswerBackend struct {
	*memBackend
	lose atomic.Bool
}

func (b *lostAnswerBackend) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	res, err := b.memBackend.Apply(ctx, cmd)
	if err == nil && b.lose.Load() {
		return fsm.Result{}, fmt.Errorf("%w (raft: leadership lost while committing log)", raftnode.ErrUnknownOutcome)
	}
	return res, err
}

// TestUnknownOutcomeIsNotResent: a write whose outcome is unknown answers 504 without Retry-After, as
// kube-apiserver answers a write that timed out. With Retry-After, client-go sends the request again, and
// the resent update (or create, or delete) of a write that did commit fails 409 (or 404): the client is
// told its write did not happen when it did (the chaos suite's watchers caught that after a failover).
func TestUnknownOutcomeIsNotResent(t *testing.T) {
	t.Parallel()
	backend := &lostAnswerBackend{memBackend: NewMemBackend()}
	client := kubernetes.NewForConfigOrDie(StartTestAPI(t, TestAPIOptions{Backend: backend}))
	cms := client.CoreV1().ConfigMaps("default")
	ctx := context.Background()
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "lost"}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	backend.lose.Store(true)
	cm.Data["v"] = "2"
	_, updateErr := cms.Update(ctx, cm, metav1.UpdateOptions{})
	_, createErr := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "lost-create"}}, metav1.CreateOptions{})
	deleteErr := cms.Delete(ctx, "lost-create", metav1.DeleteOptions{})
	backend.lose.Store(false)

	for what, err := range map[string]error{"update": updateErr, "create": createErr, "delete": deleteErr} {
		if !apierrors.IsTimeout(err) {
			t.Errorf("%s whose outcome is unknown: %v (%d), want a 504 timeout", what, err, statusCodeOf(err))
		}
	}
	// Each write did commit: the answer was lost, not the write.
	got, err := cms.Get(ctx, "lost", metav1.GetOptions{})
	if err != nil || got.Data["v"] != "2" {
		t.Fatalf("after the update: %v, %v; want v=2", got, err)
	}
	if _, err := cms.Get(ctx, "lost-create", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after the create and the delete: %v, want not found", err)
	}
}

func statusCodeOf(err error) int32 {
	if s, ok := err.(apierrors.APIStatus); ok {
		return s.Status().Code
	}
	return 0
}
