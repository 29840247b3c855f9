package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/raftnode"
)

// asToken is kubectl for a bearer token alone: a kubeconfig with the admin's server and CA, and no admin
// credential a request could fall back on.
func asToken(t *testing.T, admin kubectl, name, token string) kubectl {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(admin.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ctx := range cfg.Contexts {
		cfg.AuthInfos[ctx.AuthInfo] = &clientcmdapi.AuthInfo{Token: token}
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return kubectl{t: t, kubeconfig: path}
}

// csrManifest writes a CertificateSigningRequest manifest for a new key, and returns its path and the key.
func csrManifest(t *testing.T, name, signer, cn string, orgs ...string) (string, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}}, key)
	if err != nil {
		t.Fatal(err)
	}
	request := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	path := filepath.Join(t.TempDir(), name+".yaml")
	writeFile(t, path, fmt.Sprintf("apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {name: %s}\nspec:\n  request: %s\n  signerName: %s\n  usages: [digital signature, client auth]\n", name, request, signer))
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitForCertificate waits for the signer to issue the named request's certificate.
func waitForCertificate(t *testing.T, k kubectl, name string) []byte {
	t.Helper()
	var cert []byte
	proctest.WaitFor(t, "the certificate of CSR "+name, 60*time.Second, func() error {
		out, err := k.run("get", "csr", name, "-o", "jsonpath={.status.certificate}")
		if err != nil || out == "" {
			return fmt.Errorf("not issued yet: %s", out)
		}
		cert, err = base64.StdEncoding.DecodeString(out)
		return err
	})
	return cert
}

// asCert is kubectl for a client certificate alone.
func asCert(t *testing.T, admin kubectl, name string, certPEM, keyPEM []byte) kubectl {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(admin.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ctx := range cfg.Contexts {
		cfg.AuthInfos[ctx.AuthInfo] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return kubectl{t: t, kubeconfig: path}
}

// fixedCreds are raftnode.Credentials that never change.
type fixedCreds struct {
	cert *tls.Certificate
	pool *x509.CertPool
}

func (c fixedCreds) RaftCredentials() (*tls.Certificate, *x509.CertPool, error) {
	return c.cert, c.pool, nil
}

// bootstrapNode is a node's TLS bootstrap with the stock kubectl: as the join token's bootstrapper, it asks
// for the node's client certificate, which the leader approves and signs by itself; kubectl for the node's
// certificate comes back.
func bootstrapNode(t *testing.T, admin kubectl, token, node string) kubectl {
	t.Helper()
	bootstrapper := asToken(t, admin, "bootstrap-"+node, join.BearerToken(node, token))
	csrFile, key := csrManifest(t, "bootstrap-"+node, certificatesv1.KubeAPIServerClientKubeletSignerName, "system:node:"+node, "system:nodes")
	bootstrapper.ok("create", "-f", csrFile)
	cert := waitForCertificate(t, bootstrapper, "bootstrap-"+node)
	mustContain(t, "kubectl get csr", admin.ok("get", "csr", "bootstrap-"+node), "Approved,Issued", "system:bootstrap:"+node)
	return asCert(t, admin, node, cert, key)
}

// forbidden runs kubectl, which must fail with a 403 whose message contains every want.
func (k kubectl) forbidden(wants []string, args ...string) {
	k.t.Helper()
	out := k.fails(args...)
	mustContain(k.t, "kubectl "+strings.Join(args, " "), strings.ToLower(out), "forbidden")
	mustContain(k.t, "kubectl "+strings.Join(args, " "), out, wants...)
}

// TestAccessControl drives authentication, RBAC, the Node authorizer, NodeRestriction, escalation checks
// and the review APIs with the stock kubectl against a server, each denial through the path that makes it.
func TestAccessControl(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	// The audit log records every request at the Metadata level.
	auditDir := t.TempDir()
	policy := filepath.Join(auditDir, "policy.yaml")
	if err := os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auditLog := filepath.Join(auditDir, "audit.log")
	c := proctest.NewCluster(t, 1, fmt.Sprintf("audit {\n    path = %q\n    policy_file = %q\n    max_size = 10\n  }", auditLog, policy))
	p := c.Procs[0]
	c.Start(p)
	admin := kubectl{t: t, kubeconfig: p.Kubeconfig()}
	admin.waitForAPI("kube-system")
	// The bootstrap policy is reconciled by the leader once the API serves.
	proctest.WaitFor(t, "the bootstrap RBAC policy", 60*time.Second, func() error {
		for _, name := range []string{"clusterrole/cluster-admin", "clusterrole/view", "clusterrolebinding/system:basic-user", "clusterrole/skiff:agent"} {
			if out, err := admin.run("get", name); err != nil {
				return fmt.Errorf("%s: %s", name, out)
			}
		}
		// view aggregates the rules of system:aggregate-to-view, through the aggregation controller.
		if out, _ := admin.run("get", "clusterrole", "view", "-o", "jsonpath={.rules[*].resources}"); !strings.Contains(out, "pods") {
			return fmt.Errorf("view has no aggregated rules yet: %q", out)
		}
		return nil
	})

	t.Run("admin is system:masters by certificate", func(t *testing.T) {
		mustContain(t, "whoami", admin.ok("auth", "whoami"), "skiff-admin", "system:masters")
		mustContain(t, "can-i", admin.ok("auth", "can-i", "delete", "nodes"), "yes")
		// The admin token still works, for operators who prefer it.
		token, err := os.ReadFile(filepath.Join(p.Dir, "admin-token"))
		if err != nil {
			t.Fatal(err)
		}
		mustContain(t, "token whoami", asToken(t, admin, "admin-token", strings.TrimSpace(string(token))).ok("auth", "whoami"), "skiff-admin")
	})

	t.Run("anonymous", func(t *testing.T) {
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		server := apiAddr(t, admin.kubeconfig)
		for path, want := range map[string]int{"/api/v1/namespaces/default/pods": 401, "/apis/rbac.authorization.k8s.io/v1/clusterroles": 401, "/healthz": 200, "/version": 200} {
			resp, err := client.Get("https://" + server + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("anonymous GET %s: %d, want %d", path, resp.StatusCode, want)
			}
		}
		// A wrong token is refused, not treated as anonymous.
		mustContain(t, "wrong token", asToken(t, admin, "wrong", "not-a-token").fails("get", "pods"), "Unauthorized")
	})

	admin.ok("create", "namespace", "team")
	admin.ok("create", "namespace", "other")
	admin.ok("create", "secret", "generic", "pw", "-n", "other", "--from-literal=k=v")
	admin.ok("create", "secret", "generic", "mine", "-n", "team", "--from-literal=k=v")
	admin.ok("create", "serviceaccount", "robot", "-n", "team")
	robot := asToken(t, admin, "robot", strings.TrimSpace(admin.ok("create", "token", "robot", "-n", "team")))

	t.Run("service account", func(t *testing.T) {
		robot.forbidden([]string{`User "system:serviceaccount:team:robot" cannot list resource "secrets"`, `namespace "other"`}, "get", "secrets", "-n", "other")
		robot.forbidden([]string{`cannot list resource "nodes"`}, "get", "nodes")
		robot.forbidden([]string{`cannot list resource "pods"`}, "get", "pods", "-n", "team")
		admin.ok("create", "rolebinding", "robot-view", "-n", "team", "--clusterrole=view", "--serviceaccount=team:robot")
		proctest.WaitFor(t, "the view binding to take effect", 30*time.Second, func() error {
			if out, err := robot.run("get", "pods", "-n", "team"); err != nil {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
		// view grants no Secrets, and nothing outside its namespace.
		robot.forbidden([]string{`cannot list resource "secrets"`}, "get", "secrets", "-n", "team")
		robot.forbidden([]string{`cannot list resource "pods"`}, "get", "pods", "-n", "other")
		robot.forbidden([]string{`cannot create resource "pods"`}, "run", "x", "-n", "team", "--image=busybox")
	})

	t.Run("audit log", func(t *testing.T) {
		// Events are written as requests complete; the robot's refused list of Secrets is among them.
		proctest.WaitFor(t, "audit events", 10*time.Second, func() error {
			data, err := os.ReadFile(auditLog)
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, `"username":"system:serviceaccount:team:robot"`) && strings.Contains(line, `"resource":"secrets"`) &&
					strings.Contains(line, `"namespace":"other"`) && strings.Contains(line, `"code":403`) && strings.Contains(line, `"stage":"ResponseComplete"`) {
					return nil
				}
			}
			return fmt.Errorf("no ResponseComplete event of the robot's refused list of Secrets in %d bytes", len(data))
		})
	})

	t.Run("can-i", func(t *testing.T) {
		mustContain(t, "as admin", admin.ok("auth", "can-i", "create", "pods", "-n", "team"), "yes")
		sa := "system:serviceaccount:team:robot"
		mustContain(t, "as sa, allowed", admin.ok("auth", "can-i", "list", "pods", "-n", "team", "--as", sa), "yes")
		mustContain(t, "as sa, denied", admin.fails("auth", "can-i", "list", "secrets", "-n", "team", "--as", sa), "no")
		mustContain(t, "as sa, other namespace", admin.fails("auth", "can-i", "get", "pods", "-n", "other", "--as", sa), "no")
		list := admin.ok("auth", "can-i", "--list", "-n", "team", "--as", sa)
		mustContain(t, "can-i --list", list, "pods", "deployments.apps", "selfsubjectaccessreviews.authorization.k8s.io")
		if strings.Contains(list, "secrets ") {
			t.Errorf("can-i --list shows secrets for a view binding:\n%s", list)
		}
		// The service account asks for itself.
		mustContain(t, "self", robot.ok("auth", "can-i", "watch", "pods", "-n", "team"), "yes")
		// Impersonating needs the impersonate verb.
		robot.forbidden([]string{`User "system:serviceaccount:team:robot" cannot impersonate`}, "get", "pods", "-n", "team", "--as", "skiff-admin")
	})

	t.Run("escalation", func(t *testing.T) {
		admin.ok("create", "rolebinding", "alice-edit", "-n", "team", "--clusterrole=edit", "--user=alice")
		proctest.WaitFor(t, "alice's edit binding", 30*time.Second, func() error {
			if out, err := admin.run("auth", "can-i", "create", "deployments", "-n", "team", "--as", "alice"); err != nil {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
		// edit grants no RBAC writes at all.
		admin.forbidden([]string{`User "alice" cannot create resource "rolebindings"`},
			"create", "rolebinding", "alice-admin", "-n", "team", "--clusterrole=admin", "--user=alice", "--as", "alice")
		// Allowed to write RBAC objects, she still cannot grant what she does not hold.
		admin.ok("create", "role", "rbac-writer", "-n", "team", "--verb=create,get,list", "--resource=roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io")
		admin.ok("create", "rolebinding", "alice-rbac-writer", "-n", "team", "--role=rbac-writer", "--user=alice")
		proctest.WaitFor(t, "alice's rbac-writer binding", 30*time.Second, func() error {
			if out, err := admin.run("auth", "can-i", "create", "rolebindings", "-n", "team", "--as", "alice"); err != nil {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
		grant := "is attempting to grant RBAC permissions not currently held"
		admin.forbidden([]string{`rolebindings.rbac.authorization.k8s.io "alice-admin" is forbidden: user "alice"`, grant},
			"create", "rolebinding", "alice-admin", "-n", "team", "--clusterrole=admin", "--user=alice", "--as", "alice")
		admin.forbidden([]string{`roles.rbac.authorization.k8s.io "everything" is forbidden: user "alice"`, grant},
			"create", "role", "everything", "-n", "team", "--verb=*", "--resource=pods", "--as", "alice")
		// What alice holds, she may grant.
		admin.ok("create", "role", "pod-reader", "-n", "team", "--verb=get,list", "--resource=pods", "--as", "alice")
		admin.ok("create", "rolebinding", "bob-edit", "-n", "team", "--clusterrole=edit", "--user=bob", "--as", "alice")
	})

	t.Run("bad input", func(t *testing.T) {
		for _, c := range []struct{ doc, want string }{
			{"kind: Role\nmetadata: {name: no-verbs, namespace: team}\nrules: [{apiGroups: [''], resources: [pods], verbs: []}]", "rules[0].verbs: Required value"},
			{"kind: Role\nmetadata: {name: blank-verb, namespace: team}\nrules: [{apiGroups: [''], resources: [pods], verbs: [get, '']}]", "rules[0].verbs[1]: Invalid value"},
			{"kind: Role\nmetadata: {name: urls, namespace: team}\nrules: [{nonResourceURLs: [/healthz], verbs: [get]}]", "rules[0].nonResourceURLs: Invalid value"},
			{"kind: RoleBinding\nmetadata: {name: to-a-pod, namespace: team}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Pod, name: x}\nsubjects: [{kind: User, name: bob}]", "roleRef.kind: Unsupported value"},
			{"kind: ClusterRoleBinding\nmetadata: {name: nobody-sa}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\nsubjects: [{kind: ServiceAccount, name: robot}]", "subjects[0].namespace: Required value"},
		} {
			path := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(path, []byte("apiVersion: rbac.authorization.k8s.io/v1\n"+c.doc+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			mustContain(t, c.want, admin.fails("create", "-f", path), "is invalid", c.want)
		}
	})

	joinToken, err := os.ReadFile(filepath.Join(p.Dir, "join-token"))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("certificates", func(t *testing.T) {
		token := strings.TrimSpace(string(joinToken))
		// The join token makes a bootstrapper, which may ask for a node certificate and nothing else.
		bootstrapper := asToken(t, admin, "bootstrap", join.BearerToken("node-x", token))
		bootstrapper.forbidden([]string{`User "system:bootstrap:node-x" cannot list resource "secrets"`}, "get", "secrets", "-A")
		wrong := asToken(t, admin, "wrong-token", join.BearerToken("node-x", "not-the-join-token"))
		csrFile, _ := csrManifest(t, "wrong-token", certificatesv1.KubeAPIServerClientKubeletSignerName, "system:node:node-x", "system:nodes")
		mustContain(t, "a CSR with a wrong join token", wrong.fails("create", "--validate=false", "-f", csrFile), "Unauthorized")
		admin.fails("get", "csr", "wrong-token")

		// kubectl certificate approve and deny, for the kube-apiserver-client signer.
		janeCSR, janeKey := csrManifest(t, "jane", certificatesv1.KubeAPIServerClientSignerName, "jane", "devs")
		admin.ok("create", "-f", janeCSR)
		mustContain(t, "kubectl get csr jane", admin.ok("get", "csr", "jane"), "Pending", "kubernetes.io/kube-apiserver-client", "skiff-admin")
		bootstrapper.forbidden([]string{`cannot update resource "certificatesigningrequests/approval"`}, "certificate", "approve", "jane")
		admin.ok("certificate", "approve", "jane")
		jane := asCert(t, admin, "jane", waitForCertificate(t, admin, "jane"), janeKey)
		mustContain(t, "kubectl get csr jane", admin.ok("get", "csr", "jane"), "Approved,Issued")
		jane.forbidden([]string{`User "jane" cannot list resource "pods"`}, "get", "pods")
		deniedCSR, _ := csrManifest(t, "denied", certificatesv1.KubeAPIServerClientSignerName, "mallory")
		admin.ok("create", "-f", deniedCSR)
		admin.ok("certificate", "deny", "denied")
		time.Sleep(2 * time.Second) // a signer that wrongly signed denied requests would have done so by now
		mustContain(t, "kubectl get csr denied", admin.ok("get", "csr", "denied"), "Denied")
		if cert := admin.ok("get", "csr", "denied", "-o", "jsonpath={.status.certificate}"); cert != "" {
			t.Errorf("a denied request was issued a certificate")
		}
		mastersCSR, _ := csrManifest(t, "root", certificatesv1.KubeAPIServerClientSignerName, "root", "system:masters")
		admin.forbidden([]string{"use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"}, "create", "-f", mastersCSR)

		// Bad input: kube's validation, with field paths.
		garbage := filepath.Join(t.TempDir(), "garbage.yaml")
		writeFile(t, garbage, "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {name: garbage}\nspec: {request: bm90IGEgQ1NS, signerName: kubernetes.io/kube-apiserver-client, usages: [client auth]}\n")
		mustContain(t, "a CSR that is not one", admin.fails("create", "-f", garbage), "is invalid", "spec.request: Invalid value")
		unqualified, _ := csrManifest(t, "unqualified", "my-signer", "alice")
		mustContain(t, "an unqualified signer", admin.fails("create", "-f", unqualified), "is invalid", "spec.signerName: Invalid value")
	})

	t.Run("raft port", func(t *testing.T) {
		// The internal write RPC on the server process's Raft port: plain TCP and a node's certificate from
		// the cluster CA get no write in; the server's own certificate (the control) does.
		token := strings.TrimSpace(string(joinToken))
		bootstrapper := asToken(t, admin, "bootstrap-raft-node", join.BearerToken("raft-node", token))
		csrFile, keyPEM := csrManifest(t, "bootstrap-raft-node", certificatesv1.KubeAPIServerClientKubeletSignerName, "system:node:raft-node", "system:nodes")
		bootstrapper.ok("create", "-f", csrFile)
		nodeCert, err := tls.X509KeyPair(waitForCertificate(t, bootstrapper, "bootstrap-raft-node"), keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		caPEM, err := os.ReadFile(filepath.Join(p.Dir, "pki", "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		write := func(client *raftnode.Client, key string) error {
			defer client.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res, err := client.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: []byte("x")})
			if err == nil {
				err = res.Err()
			}
			return err
		}
		if err := write(raftnode.NewClient(p.RaftAddr, raftnode.TCPLayer{}), "/e2e/raft-door/tcp"); err == nil {
			t.Fatal("a plain TCP client wrote to the store")
		}
		if err := write(raftnode.NewClient(p.RaftAddr, raftnode.TLSLayer{Creds: fixedCreds{&nodeCert, pool}}), "/e2e/raft-door/node"); err == nil {
			t.Fatal("a node's certificate wrote to the store")
		}
		if err := write(p.RaftClient(t), "/e2e/raft-door/server"); err != nil {
			t.Fatalf("the server's own certificate could not write: %v", err)
		}
	})

	t.Run("nodes", func(t *testing.T) {
		token := strings.TrimSpace(string(joinToken))
		nodeA := bootstrapNode(t, admin, token, "node-a")
		nodeB := bootstrapNode(t, admin, token, "node-b")
		for _, n := range []kubectl{nodeA, nodeB} {
			name := strings.TrimSuffix(filepath.Base(n.kubeconfig), ".kubeconfig")
			applyYAML(t, n, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n", name))
		}
		admin.ok("create", "secret", "generic", "a-secret", "-n", "team", "--from-literal=k=a")
		admin.ok("create", "secret", "generic", "b-secret", "-n", "team", "--from-literal=k=b")
		for _, n := range []string{"a", "b"} {
			applyYAML(t, admin, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: uses-%[1]s, namespace: team}
spec:
  nodeName: node-%[1]s
  containers:
  - name: c
    image: busybox
    env: [{name: K, valueFrom: {secretKeyRef: {name: %[1]s-secret, key: k}}}]
`, n))
		}
		proctest.WaitFor(t, "node-a to read its own pod's secret", 30*time.Second, func() error {
			if out, err := nodeA.run("get", "secret", "a-secret", "-n", "team"); err != nil {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
		nodeA.forbidden([]string{`User "system:node:node-a" cannot get resource "secrets"`, "no relationship found between node 'node-a' and this object"},
			"get", "secret", "b-secret", "-n", "team")
		nodeA.forbidden([]string{`cannot list resource "secrets"`}, "get", "secrets", "-n", "team")
		nodeA.forbidden([]string{`node "node-a" is not allowed to modify node "node-b"`}, "patch", "node", "node-b", "-p", `{"metadata":{"labels":{"x":"y"}}}`)
		nodeA.forbidden([]string{`cannot delete resource "nodes"`}, "delete", "node", "node-a")
		nodeA.forbidden([]string{"node-restriction.kubernetes.io/pool"}, "label", "node", "node-a", "node-restriction.kubernetes.io/pool=gold")
		nodeA.ok("label", "node", "node-a", "example.com/rack=r1")
		nodeA.forbidden([]string{`node "node-a" can only delete pods with spec.nodeName set to itself`}, "delete", "pod", "uses-b", "-n", "team")
		nodeA.forbidden([]string{"can only create mirror pods"}, "run", "sneaky", "-n", "team", "--image=busybox", "--overrides", `{"spec":{"nodeName":"node-a"}}`)
	})
}
