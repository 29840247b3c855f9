package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestLocalLoadBalancer: on `skiff local`, whose servers have a pool on the cluster's own network (which this
// machine is on), `kubectl get svc` shows a LoadBalancer Service's address, the machine reaches the Service's
// pods at it (with externalTrafficPolicy Local, the pod sees the machine's own address), and when the agent answering for it is killed with kill -9 the other one takes it over
// (announced with gratuitous ARP) and the address keeps answering. A node labelled
// node.kubernetes.io/exclude-from-external-load-balancers hands the address to another.
func TestLocalLoadBalancer(t *testing.T) {
	parallel(t)
	requireRealRuntime(t)
	bin := proctest.Binary(t)
	dir := t.TempDir()
	st := upLocalCluster(t, bin, dir, "--servers", "1")
	k := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	k.waitNodeHealth("agent-1", "True/", 60*time.Second)
	k.waitNodeHealth("agent-2", "True/", 60*time.Second)
	k.waitForAPI("default")
	applyYAML(t, k, `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}]
      containers:
      - name: httpd
        image: skiff.local/busybox:1
        command: ["sh", "-c", "mkdir -p /www/cgi-bin && hostname > /www/index.html && printf '#!/bin/sh\\necho\\necho peer=$REMOTE_ADDR\\n' > /www/cgi-bin/peer && chmod +x /www/cgi-bin/peer && exec httpd -f -p 8080 -h /www"]
---
apiVersion: v1
kind: Service
metadata: {name: web-local}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`)
	k.ok("rollout", "status", "deployment/web", "--timeout=120s")
	externalIP := func(svc string) string {
		var ip string
		proctest.WaitFor(t, svc+"'s EXTERNAL-IP", 60*time.Second, func() error {
			out := k.ok("get", "svc", svc, "--no-headers")
			if f := strings.Fields(out); len(f) < 4 || f[3] == "<pending>" {
				return fmt.Errorf("not yet: %s", out)
			}
			ip = strings.Fields(out)[3]
			return nil
		})
		return ip
	}
	fetch := func(ip, path string) (string, error) {
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get("http://" + ip + path)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(body)), err
	}
	ip := externalIP("web")
	get := func() error {
		body, err := fetch(ip, "/")
		if err == nil && !strings.HasPrefix(body, "web-") {
			err = fmt.Errorf("%s answered %q", ip, body)
		}
		return err
	}
	proctest.WaitFor(t, "web at "+ip+" from this machine", 30*time.Second, get)

	// externalTrafficPolicy Local keeps the client's address: the pod sees this machine's, on the cluster's
	// network, not a node's.
	localIP := externalIP("web-local")
	proctest.WaitFor(t, "web-local at "+localIP+" to see this machine's address", 30*time.Second, func() error {
		body, err := fetch(localIP, "/cgi-bin/peer")
		if err != nil {
			return err
		}
		if peer := strings.TrimPrefix(strings.Trim(strings.TrimPrefix(body, "peer="), "[]"), "::ffff:"); peer != st.Gateway {
			return fmt.Errorf("the pod saw the client as %q, want this machine's %s", body, st.Gateway)
		}
		return nil
	})

	// The agent that answers for the address says so in an event on the Service.
	announcer := func() string {
		out := k.ok("get", "events", "--field-selector", "involvedObject.name=web,reason=LoadBalancerAnnounced",
			"--sort-by", ".lastTimestamp", "-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var node string
		fmt.Sscanf(lines[len(lines)-1], "node %s answers", &node)
		return node
	}
	// Who answers is read from the agents' events, and client-go's recorder writes an agent's events one at a
	// time, retrying a failed write after up to 10 s: on a loaded machine an announcement can show late
	// (CI once waited over 30 s for one), hence the minute and a half.
	const announceWait = 90 * time.Second
	var first string
	proctest.WaitFor(t, "an agent announcing "+ip, announceWait, func() error {
		if first = announcer(); first == "" {
			return fmt.Errorf("no LoadBalancerAnnounced event yet")
		}
		return nil
	})
	// A node labelled node.kubernetes.io/exclude-from-external-load-balancers stops answering; the other takes
	// the address, and gives it back when the label goes.
	k.ok("label", "node", first, "node.kubernetes.io/exclude-from-external-load-balancers=true")
	proctest.WaitFor(t, "the other agent to answer for "+ip+" once "+first+" is excluded", announceWait, func() error {
		if now := announcer(); now == first || now == "" {
			return fmt.Errorf("still %s", now)
		}
		return nil
	})
	proctest.WaitFor(t, "web at "+ip+" while "+first+" is excluded", 30*time.Second, get)
	k.ok("label", "node", first, "node.kubernetes.io/exclude-from-external-load-balancers-")
	proctest.WaitFor(t, first+" to answer for "+ip+" again", announceWait, func() error {
		if now := announcer(); now != first {
			return fmt.Errorf("now %s", now)
		}
		return nil
	})

	killed := time.Now()
	if err := st.Kill(first); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "another agent to take "+ip+" over", 60*time.Second, func() error {
		if now := announcer(); now == first || now == "" {
			return fmt.Errorf("still %s", now)
		}
		return nil
	})
	t.Logf("%s killed; %s answers for %s %.1f s later", first, announcer(), ip, time.Since(killed).Seconds())
	proctest.WaitFor(t, "web at "+ip+" after the takeover", 30*time.Second, get)
}
