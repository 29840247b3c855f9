package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/internal/proctest"
)

// kubeAPIServerModule is the kube-apiserver the benchmarks run beside Skiff: the release whose libraries
// Skiff links, built from the module graph Skiff already requires.
const kubeAPIServerModule = "k8s.io/kubernetes/cmd/kube-apiserver"

// kubeAPIServerBinary builds kube-apiserver v1.37.2 once per machine into the user cache directory and
// returns its path. It builds in a copy of Skiff's go.mod (with -mod=mod), so that the packages only
// kube-apiserver needs (OIDC, bootstrap tokens) stay out of Skiff's own go.sum. A cold build takes minutes.
func kubeAPIServerBinary(b *testing.B) string {
	b.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(cache, "skiff-bench", "kube-apiserver-v1.37.2")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	mod := b.TempDir()
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mod, f), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("building %s into %s (once per machine)", kubeAPIServerModule, bin)
	start := time.Now()
	cmd := exec.Command("go", "build", "-mod=mod", "-o", bin, kubeAPIServerModule)
	cmd.Dir = mod
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s: %v\n%s", kubeAPIServerModule, err, out)
	}
	b.Logf("built kube-apiserver in %v", time.Since(start).Round(time.Second))
	return bin
}

// kubeAPIServers is three kube-apiserver 1.37.2 processes, each over its own member of a three-member etcd
// cluster (kubeadm's stacked topology), on 127.0.0.1-3, with the admission plugins and RBAC kube-apiserver
// enables by default. No controller manager runs: the benchmarks create what it would (a namespace's default
// service account) themselves.
type kubeAPIServers struct {
	etcd    *etcdCluster
	cmds    []*exec.Cmd
	configs []*rest.Config
}

// pids are the processes whose CPU and memory the benchmarks count: kube-apiserver's and etcd's, which
// together do what Skiff's server processes do.
func (k *kubeAPIServers) pids() []int {
	var pids []int
	for _, c := range append(append([]*exec.Cmd(nil), k.cmds...), k.etcd.cmds...) {
		pids = append(pids, c.Process.Pid)
	}
	return pids
}

func (k *kubeAPIServers) stop() {
	for _, cmd := range k.cmds {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}
	k.etcd.stop()
}

// startKubeAPIServers starts the etcd cluster and three kube-apiservers, and waits until each is ready.
func startKubeAPIServers(b *testing.B) *kubeAPIServers {
	b.Helper()
	bin := kubeAPIServerBinary(b)
	k := &kubeAPIServers{etcd: startEtcd(b)}
	b.Cleanup(k.stop)
	dir := b.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		b.Fatal(err)
	}
	saKey := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		b.Fatal(err)
	}
	const token = "skiff-bench-kube-apiserver-token"
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+`,bench-admin,bench-admin,"system:masters"`+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	ips := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	port := freeport.Take(b, ips, 1)[0]
	for i, ip := range ips {
		certDir := filepath.Join(dir, fmt.Sprintf("kas%d", i))
		cmd := exec.Command(bin,
			"--etcd-servers", k.etcd.endpoints[i],
			// kube-apiserver keeps default/kubernetes's endpoints only for addresses off the loopback range.
			"--bind-address", ip, "--advertise-address", ip, "--endpoint-reconciler-type", "none",
			"--secure-port", fmt.Sprint(port), "--cert-dir", certDir,
			"--service-cluster-ip-range", "10.96.0.0/16", "--authorization-mode", "RBAC", "--token-auth-file", tokens,
			"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
			"--service-account-issuer", "https://kubernetes.default.svc", "--profiling=false")
		logPath := filepath.Join(dir, fmt.Sprintf("kas%d.log", i))
		logf, err := os.Create(logPath)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if b.Failed() {
				data, _ := os.ReadFile(logPath)
				b.Logf("--- kube-apiserver %d log (tail) ---\n%s", i+1, data[max(0, len(data)-3000):])
			}
		})
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		k.cmds = append(k.cmds, cmd)
		k.configs = append(k.configs, &rest.Config{Host: fmt.Sprintf("https://%s:%d", ip, port), BearerToken: token,
			TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: -1})
	}
	for i, cfg := range k.configs {
		client, err := rest.HTTPClientFor(cfg)
		if err != nil {
			b.Fatal(err)
		}
		proctest.WaitFor(b, fmt.Sprintf("kube-apiserver %d ready", i+1), 2*time.Minute, func() error {
			req, _ := http.NewRequest(http.MethodGet, cfg.Host+"/readyz", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/readyz: %s", resp.Status)
			}
			return nil
		})
	}
	return k
}

// createNamespaceWithServiceAccount creates a namespace and its default service account, which pod
// admission requires and kube-controller-manager would create.
func createNamespaceWithServiceAccount(b *testing.B, ctx context.Context, cfg *rest.Config, ns string) {
	b.Helper()
	client := kubeClient(b, cfg)
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
}
