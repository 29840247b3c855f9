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

// kubeAPIServerBinary builds kube-apiserver v1.37.2 once per machine (benchBuild).
func kubeAPIServerBinary(b *testing.B) string {
	return benchBuild(b, buildSpec{name: "kube-apiserver-v1.37.2", pkg: kubeAPIServerModule})
}

// buildSpec is a program the benchmarks run beside Skiff.
type buildSpec struct {
	name string   // the binary's name in the cache, with its version
	pkg  string   // the main package
	gets []string // modules to `go get` first, module@version
	// main, when set, is the source of a main package built instead of pkg (for a program whose entry point
	// is a library function, as etcd's etcdmain.Main).
	main string
	// after, when set, runs after the build in the module copy, with the cache directory (to keep files the
	// program needs, such as kwok's stage definitions).
	after func(mod, cacheDir string) error
}

// benchBuild builds a program once per machine into the user cache directory and returns its path. It builds
// in a copy of Skiff's go.mod (with -mod=mod), so that the packages only these programs need stay out of
// Skiff's own go.sum; the replace block keeps every Kubernetes module at v1.37.2's. A cold build takes minutes.
func benchBuild(b *testing.B, spec buildSpec) string {
	b.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		b.Fatal(err)
	}
	cacheDir := filepath.Join(cache, "skiff-bench")
	bin := filepath.Join(cacheDir, spec.name)
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
	gocmd := func(args ...string) {
		if out, err := goOutput(mod, args...); err != nil {
			b.Fatalf("go %v: %v\n%s", args, err, out)
		}
	}
	for _, g := range spec.gets {
		gocmd("get", g)
	}
	pkg := spec.pkg
	if spec.main != "" {
		if err := os.MkdirAll(filepath.Join(mod, "cmd"), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mod, "cmd", "main.go"), []byte(spec.main), 0o644); err != nil {
			b.Fatal(err)
		}
		pkg = "./cmd"
	}
	b.Logf("building %s into %s (once per machine)", spec.name, bin)
	start := time.Now()
	gocmd("build", "-o", bin+".tmp", pkg)
	if spec.after != nil {
		if err := spec.after(mod, cacheDir); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		b.Fatal(err)
	}
	b.Logf("built %s in %v", spec.name, time.Since(start).Round(time.Second))
	return bin
}

// goOutput runs the go command in dir, in module mode with -mod=mod, and returns what it printed.
func goOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// kubeAPIServers is three kube-apiserver 1.37.2 processes, each over its own member of a three-member etcd
// cluster (kubeadm's stacked topology), on 127.0.0.1-3, with the admission plugins and RBAC kube-apiserver
// enables by default. No controller manager runs: the benchmarks create what it would (a namespace's default
// service account) themselves.
type kubeAPIServers struct {
	etcd     *etcdCluster
	servers  []*benchProc
	configs  []*rest.Config
	saKey    string   // the service account signing key, which kube-controller-manager signs tokens with too
	certDirs []string // each server's --cert-dir, where it writes its self-signed serving certificate
}

// pids are the processes whose CPU and memory the benchmarks count: kube-apiserver's and etcd's, which
// together do what Skiff's server processes do.
func (k *kubeAPIServers) pids() []int {
	var pids []int
	for _, p := range append(append([]*benchProc(nil), k.servers...), k.etcd.members...) {
		pids = append(pids, p.pid())
	}
	return pids
}

func (k *kubeAPIServers) stop() {
	for _, p := range k.servers {
		p.kill()
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
	k.saKey = saKey
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
		k.certDirs = append(k.certDirs, certDir)
		p := &benchProc{name: fmt.Sprintf("kube-apiserver %d", i+1), bin: bin, log: filepath.Join(dir, fmt.Sprintf("kas%d.log", i)), args: []string{
			"--etcd-servers", k.etcd.endpoints[i],
			// kube-apiserver keeps default/kubernetes's endpoints only for addresses off the loopback range.
			"--bind-address", ip, "--advertise-address", ip, "--endpoint-reconciler-type", "none",
			"--secure-port", fmt.Sprint(port), "--cert-dir", certDir,
			"--service-cluster-ip-range", "10.96.0.0/16", "--authorization-mode", "RBAC", "--token-auth-file", tokens,
			"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
			"--service-account-issuer", "https://kubernetes.default.svc", "--profiling=false"}}
		b.Cleanup(func() {
			if b.Failed() {
				b.Logf("--- %s log (tail) ---\n%s", p.name, p.logTail())
			}
		})
		p.start(b)
		k.servers = append(k.servers, p)
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
