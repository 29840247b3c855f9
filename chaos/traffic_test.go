package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// trafficKubeconfig writes a kubeconfig with a context per peer, as localcluster does for a local cluster.
func trafficKubeconfig(t *testing.T, peers []*servertest.Peer) string {
	t.Helper()
	merged := clientcmdapi.NewConfig()
	for i, p := range peers {
		cfg, err := clientcmd.LoadFromFile(p.Server.KubeconfigPath())
		if err != nil {
			t.Fatal(err)
		}
		cur := cfg.Contexts[cfg.CurrentContext]
		if cur == nil {
			t.Fatalf("%s has no current context", p.Server.KubeconfigPath())
		}
		name := fmt.Sprintf("cp-%d", i)
		merged.Clusters[name] = cfg.Clusters[cur.Cluster]
		merged.AuthInfos[name] = cfg.AuthInfos[cur.AuthInfo]
		merged.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
		if merged.CurrentContext == "" {
			merged.CurrentContext = name
		}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*merged, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTrafficAgainstHealthyCluster runs the traffic, on ConfigMaps and on custom resources, against three
// in-process servers without faults: every check must pass, and the traffic must have done each kind of
// request.
func TestTrafficAgainstHealthyCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three servers")
	}
	peers := servertest.Start(t, 3)
	kubeconfig := trafficKubeconfig(t, peers)
	for _, resource := range []Resource{ConfigMaps, CustomResources} {
		t.Run(resource.String(), func(t *testing.T) { checkHealthyTraffic(t, kubeconfig, resource) })
	}
}

func checkHealthyTraffic(t *testing.T, kubeconfig string, resource Resource) {
	traffic, err := NewTraffic(kubeconfig, 42, TrafficOptions{Resource: resource})
	if err != nil {
		t.Fatal(err)
	}
	defer traffic.Close()
	if got := len(traffic.Servers()); got != 3 {
		t.Fatalf("traffic uses %d servers, want 3", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h := traffic.Run(ctx)
	if h.Err != nil {
		t.Fatal(h.Err)
	}
	counts := h.Counts()
	t.Logf("%d ops in %v: %v", len(h.Ops), h.Duration.Round(time.Millisecond), counts)
	for _, k := range []string{"create/ok", "create/409", "update/ok", "update/409", "delete/ok", "get/ok", "get/404", "list/ok"} {
		if counts[k] == 0 {
			t.Errorf("no %s in the history", k)
		}
	}
	servers := map[string]int{}
	for i := range h.Ops {
		op := &h.Ops[i]
		servers[op.Server]++
		if op.Stale && op.Outcome != OutcomeFailed {
			t.Errorf("a stale update was not refused: %s", op)
		}
	}
	if len(servers) != 3 {
		t.Errorf("requests went to %v, want all three servers", servers)
	}

	readCtx, cancelRead := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelRead()
	final, err := traffic.ReadFinal(readCtx)
	if err != nil {
		t.Fatal(err)
	}
	viz := filepath.Join(t.TempDir(), "viz.html")
	if err := CheckLinearizable(h, time.Minute, viz); err != nil {
		t.Errorf("%v%s", err, diagnoseRefusals(h))
	}
	if err := CheckListFreshness(h); err != nil {
		t.Error(err)
	}
	if err := CheckNoLostWrites(h, final); err != nil {
		t.Error(err)
	}
}

// diagnoseRefusals says whether the history is linearizable without the refusals (409, 404) of updates and
// deletes: if so, the servers refused writes on the strength of a stale read (a follower deciding a
// precondition on its local store, which lags the leader).
func diagnoseRefusals(h *History) string {
	rest := &History{Namespace: h.Namespace}
	var refusals []string
	for i := range h.Ops {
		op := &h.Ops[i]
		if (op.Kind == OpUpdate || op.Kind == OpDelete) && op.Outcome == OutcomeFailed {
			refusals = append(refusals, op.Server)
			continue
		}
		rest.Ops = append(rest.Ops, *op)
	}
	if len(refusals) == 0 || CheckLinearizable(rest, time.Minute, "") != nil {
		return ""
	}
	return fmt.Sprintf("\nWithout the %d refusals of updates and deletes the history is linearizable: a server refused a "+
		"write whose precondition held, having checked it against a stale local read", len(refusals))
}
