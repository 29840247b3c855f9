package bench

import (
	"context"
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestMain removes the skiff binary the tests built (when SKIFF_BIN did not name one).
func TestMain(m *testing.M) {
	code := m.Run()
	proctest.RemoveBuiltBinary()
	os.Exit(code)
}

// firstCallOfTwo reports whether this call of a benchmark is the testing package's first, with b.N = 1, made
// only to be followed by the call with -benchtime's count: a benchmark without b.Loop is called once with
// b.N = 1 before the run that counts, even with a fixed count ("200x"). Those here start clusters, which
// that first call would start (and stop) for nothing. With a duration as -benchtime the first call sizes the
// next, and must run.
func firstCallOfTwo(b *testing.B) bool {
	benchtime := flag.Lookup("test.benchtime")
	if b.N != 1 || benchtime == nil {
		return false
	}
	count, isCount := strings.CutSuffix(benchtime.Value.String(), "x")
	n, err := strconv.Atoi(count)
	return isCount && err == nil && n > 1
}

// createNamespace creates a namespace and waits for its default service account, as a user of a fresh
// namespace must: the ServiceAccount admission refuses pods until the controller has made it.
func createNamespace(tb testing.TB, ctx context.Context, client kubernetes.Interface, ns string) {
	tb.Helper()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("namespace %s has no default service account after a minute: %v", ns, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
