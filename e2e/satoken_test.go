package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

// saDir is where the ServiceAccount admission mounts a pod's API credentials.
const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// TestServiceAccountToken checks service account tokens in pods end to end on `skiff local` (one server, one
// agent on containerd, the service proxy and cluster DNS): a pod gets the kube-api-access volume (a token
// bound to it, the cluster CA from kube-root-ca.crt, its namespace) and, calling
// https://kubernetes.default.svc with them, can do what its account's RoleBinding allows and nothing else; a
// pod that opts out has nothing mounted; a pod whose account does not exist is refused. The pod also has the
// service links of its namespace's Services (enableServiceLinks).
func TestServiceAccountToken(t *testing.T) {
	parallel(t)
	requireRealRuntime(t)
	dir, err := os.MkdirTemp("", "skiff-satoken-")
	if err != nil {
		t.Fatal(err)
	}
	bin := proctest.Binary(t)
	imageDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		t.Fatal(err)
	}
	const image = "skiff.test/server:1"
	if err := testimages.WriteServerTarball(image, filepath.Join(imageDir, "server.tar")); err != nil {
		t.Fatal(err)
	}
	st := upLocalCluster(t, bin, dir, "--servers", "1", "--agents", "1", "--images", imageDir)
	k := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := k.run("describe", "pods", "-n", "sa-e2e")
			t.Logf("kubectl describe pods -n sa-e2e:\n%s", out)
		}
	})
	proctest.WaitFor(t, "the view role with its aggregated rules", 60*time.Second, func() error {
		if out, _ := k.run("get", "clusterrole", "view", "-o", "jsonpath={.rules[*].resources}"); !strings.Contains(out, "pods") {
			return fmt.Errorf("view has no aggregated rules yet: %q", out)
		}
		return nil
	})

	k.ok("create", "namespace", "sa-e2e")
	k.ok("create", "namespace", "sa-other")
	k.ok("create", "serviceaccount", "reader", "-n", "sa-e2e")
	k.ok("create", "rolebinding", "reader-view", "-n", "sa-e2e", "--clusterrole=view", "--serviceaccount=sa-e2e:reader")
	k.ok("create", "service", "clusterip", "links", "--tcp=80:8080", "-n", "sa-e2e") // before the pods, for their links
	applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: reader, namespace: sa-e2e}
spec:
  serviceAccountName: reader
  containers:
  - name: c
    image: %[1]s
---
apiVersion: v1
kind: Pod
metadata: {name: no-token, namespace: sa-e2e}
spec:
  serviceAccountName: reader
  automountServiceAccountToken: false
  containers:
  - name: c
    image: %[1]s
    imagePullPolicy: Always # pulled from the cluster's registry, which serves --images (localcluster/registry.go)
`, image))

	t.Run("the pod's spec", func(t *testing.T) {
		k := k.withT(t)
		vol := k.ok("get", "pod", "reader", "-n", "sa-e2e", "-o", `jsonpath={range .spec.volumes[*]}{.name} {.projected.defaultMode} {.projected.sources[0].serviceAccountToken.expirationSeconds} {.projected.sources[1].configMap.name}{"\n"}{end}`)
		if f := strings.Fields(vol); len(f) != 4 || !strings.HasPrefix(f[0], "kube-api-access-") || len(f[0]) != len("kube-api-access-")+5 ||
			f[1] != "420" || f[2] != "3607" || f[3] != "kube-root-ca.crt" {
			t.Fatalf("volumes of reader: %q, want one kube-api-access-xxxxx, mode 420, 3607 s, kube-root-ca.crt", vol)
		}
		mount := k.ok("get", "pod", "reader", "-n", "sa-e2e", "-o", `jsonpath={range .spec.containers[0].volumeMounts[*]}{.name} {.mountPath} {.readOnly}{"\n"}{end}`)
		mustContain(t, "reader's mounts", mount, strings.Fields(vol)[0]+" "+saDir+" true")
		if out := k.ok("get", "pod", "no-token", "-n", "sa-e2e", "-o", "jsonpath={.spec.volumes}{.spec.containers[0].volumeMounts}"); out != "" {
			t.Errorf("no-token has volumes or mounts: %s", out)
		}
	})

	for _, pod := range []string{"reader", "no-token"} {
		proctest.WaitFor(t, pod+" Running", 120*time.Second, func() error {
			if out := k.ok("get", "pod", pod, "-n", "sa-e2e", "--no-headers"); !strings.Contains(out, "Running") {
				return fmt.Errorf("not yet: %s", out)
			}
			return nil
		})
	}

	if out := k.ok("get", "events", "-n", "sa-e2e", "--field-selector", "involvedObject.name=no-token,reason=Pulled", "-o", "jsonpath={.items[*].message}"); !strings.Contains(out, "Successfully pulled image") {
		t.Errorf("no-token (imagePullPolicy: Always) was not pulled from the cluster's registry: events %q", out)
	}

	t.Run("what is mounted", func(t *testing.T) {
		k := k.withT(t)
		if ns := k.stdout("exec", "reader", "-n", "sa-e2e", "--", "cat", saDir+"/namespace"); ns != "sa-e2e" {
			t.Errorf("namespace file: %q", ns)
		}
		cfg, err := clientcmd.LoadFromFile(k.kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		ca := k.stdout("exec", "reader", "-n", "sa-e2e", "--", "cat", saDir+"/ca.crt")
		for _, cluster := range cfg.Clusters {
			if strings.TrimSpace(ca) != strings.TrimSpace(string(cluster.CertificateAuthorityData)) {
				t.Errorf("ca.crt is not the cluster CA of the kubeconfig:\n%s", ca)
			}
		}
		// The token is bound to this pod and its account.
		token := k.stdout("exec", "reader", "-n", "sa-e2e", "--", "cat", saDir+"/token")
		parts := strings.Split(token, ".")
		if len(parts) != 3 {
			t.Fatalf("token is not a JWT: %q", token)
		}
		payload, err := base64.RawURLEncoding.DecodeString(parts[1])
		if err != nil {
			t.Fatal(err)
		}
		var claims struct {
			Sub string `json:"sub"`
			Exp int64  `json:"exp"`
			Iat int64  `json:"iat"`
			K8s struct {
				Namespace string `json:"namespace"`
				Pod       struct {
					Name string `json:"name"`
					UID  string `json:"uid"`
				} `json:"pod"`
			} `json:"kubernetes.io"`
		}
		if err := json.Unmarshal(payload, &claims); err != nil {
			t.Fatal(err)
		}
		uid := k.ok("get", "pod", "reader", "-n", "sa-e2e", "-o", "jsonpath={.metadata.uid}")
		if claims.Sub != "system:serviceaccount:sa-e2e:reader" || claims.K8s.Namespace != "sa-e2e" || claims.K8s.Pod.Name != "reader" ||
			claims.K8s.Pod.UID != uid || claims.Exp-claims.Iat != 3607 {
			t.Errorf("token claims %s", payload)
		}
		if out, err := k.run("exec", "no-token", "-n", "sa-e2e", "--", "ls", saDir); err == nil {
			t.Errorf("no-token has %s: %s", saDir, out)
		}
	})

	t.Run("the service links", func(t *testing.T) {
		k := k.withT(t)
		ip := k.ok("get", "service", "links", "-n", "sa-e2e", "-o", "jsonpath={.spec.clusterIP}")
		env := k.stdout("exec", "reader", "-n", "sa-e2e", "--", "env")
		if want := "LINKS_SERVICE_HOST=" + ip; ip == "" || !slices.Contains(strings.Split(env, "\n"), want) {
			t.Errorf("the pod's environment has no %s:\n%s", want, env)
		}
	})

	// get has the reader pod GET path from the API by its in-cluster name with its own credentials.
	get := func(path string) (string, error) {
		out, err := k.run("exec", "reader", "-n", "sa-e2e", "--", "/server", "-get", "https://kubernetes.default.svc"+path,
			"-bearer-file", saDir+"/token", "-ca-file", saDir+"/ca.crt")
		return fromHTTPLine(out), err
	}
	t.Run("the API from the pod", func(t *testing.T) {
		// The binding, the proxy's rules and DNS may each take a moment.
		proctest.WaitFor(t, "the pod to list its namespace's pods", 60*time.Second, func() error {
			out, err := get("/api/v1/namespaces/sa-e2e/pods")
			if err != nil || !strings.HasPrefix(out, "HTTP 200") || !strings.Contains(out, `"name":"reader"`) {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		// As client-go's in-cluster config finds the API: the kubelet's KUBERNETES_SERVICE_HOST and _PORT
		// variables, the ClusterIP, which the serving certificate must name.
		out, err := k.run("exec", "reader", "-n", "sa-e2e", "--", "/server", "-get",
			"https://${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT}/api/v1/namespaces/sa-e2e/pods",
			"-bearer-file", saDir+"/token", "-ca-file", saDir+"/ca.crt")
		if out = fromHTTPLine(out); err != nil || !strings.HasPrefix(out, "HTTP 200") {
			t.Errorf("GET by the service variables: %v: %s", err, out)
		}
		for _, c := range []struct{ path, want string }{
			{"/api/v1/namespaces/sa-e2e/secrets", `User \"system:serviceaccount:sa-e2e:reader\" cannot list resource \"secrets\" in API group \"\" in the namespace \"sa-e2e\"`},
			{"/api/v1/namespaces/sa-other/pods", `cannot list resource \"pods\" in API group \"\" in the namespace \"sa-other\"`},
		} {
			out, err := get(c.path)
			if err != nil || !strings.HasPrefix(out, "HTTP 403") {
				t.Errorf("GET %s: %v: %s; want 403", c.path, err, out)
				continue
			}
			mustContain(t, "GET "+c.path, out, c.want)
		}
	})

	t.Run("a pod whose account does not exist", func(t *testing.T) {
		k := k.withT(t)
		out := k.fails("run", "ghost", "-n", "sa-e2e", "--image="+image, "--restart=Never", "--overrides", `{"spec":{"serviceAccountName":"ghost"}}`)
		mustContain(t, "kubectl run with a missing account", out,
			`pods "ghost" is forbidden: error looking up service account sa-e2e/ghost: serviceaccount "ghost" not found`)
	})
}

// fromHTTPLine is the output of the test server's -get from its "HTTP <code>" line on: kubectl exec may print
// its own messages first, on the same combined output ("Unknown stream id 1, discarding message").
func fromHTTPLine(out string) string {
	if strings.HasPrefix(out, "HTTP ") {
		return out
	}
	if i := strings.Index(out, "\nHTTP "); i >= 0 {
		return out[i+1:]
	}
	return out
}
