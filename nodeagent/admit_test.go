package nodeagent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/oci"
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/config"
)

// TestAdmitSysctls: the kubelet's sysctl admission with its default allowlist: the safe sysctls pass (with
// slashes as separators too), any other is SysctlForbidden, and a network sysctl of a hostNetwork pod too.
func TestAdmitSysctls(t *testing.T) {
	pod := func(hostNet bool, sysctls ...string) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{HostNetwork: hostNet, SecurityContext: &corev1.PodSecurityContext{}}}
		for _, s := range sysctls {
			p.Spec.SecurityContext.Sysctls = append(p.Spec.SecurityContext.Sysctls, corev1.Sysctl{Name: s, Value: "1"})
		}
		return p
	}
	cases := []struct {
		name    string
		pod     *corev1.Pod
		message string // "" when admitted
	}{
		{"none", &corev1.Pod{}, ""},
		{"safe", pod(false, "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_keepalive_time"), ""},
		{"slashes", pod(false, "kernel/shm_rmid_forced"), ""},
		{"unsafe", pod(false, "kernel.shm_rmid_forced", "kernel.msgmax"), `forbidden sysctl: "kernel.msgmax" not allowlisted`},
		{"net sysctl with host network", pod(true, "net.ipv4.tcp_syncookies"), `forbidden sysctl: "net.ipv4.tcp_syncookies" not allowed with host Net enabled`},
		{"ipc sysctl with host network", pod(true, "kernel.shm_rmid_forced"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := admitSysctls(tc.pod)
			if res.message != tc.message || (tc.message != "" && res.reason != "SysctlForbidden") {
				t.Errorf("admitSysctls = %+v, want message %q", res, tc.message)
			}
		})
	}
}

// TestSandboxSysctls: the pod's sysctls, by their dotted names, go into the sandbox's OCI spec.
func TestSandboxSysctls(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{
		{Name: "kernel/shm_rmid_forced", Value: "1"}, {Name: "net.ipv4.ip_local_port_range", Value: "1024 65000"}}}}}
	spec, err := genSpec(t, []oci.SpecOpts{withSysctls(podSysctls(pod))})
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Linux.Sysctl; got["kernel.shm_rmid_forced"] != "1" || got["net.ipv4.ip_local_port_range"] != "1024 65000" || len(got) != 2 {
		t.Errorf("sysctls %v", got)
	}
	plain, err := genSpec(t, []oci.SpecOpts{withSysctls(podSysctls(&corev1.Pod{}))})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Linux != nil && len(plain.Linux.Sysctl) != 0 {
		t.Errorf("a pod without sysctls got %v", plain.Linux.Sysctl)
	}
}

func admissionAgent(t *testing.T, rt Runtime, pods ...*corev1.Pod) (*Agent, *fake.Clientset) {
	t.Helper()
	client := fake.NewSimpleClientset()
	a := &Agent{cfg: &config.Agent{AdvertiseAddr: "10.0.0.1"}, logger: hclog.NewNullLogger(), runtime: rt, client: client,
		nodes: map[string]bool{"n1": true}, running: map[string]*corev1.Pod{}, finished: map[string]*corev1.Pod{},
		statusWrites: make(chan struct{}, 1), pods: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	for _, p := range pods {
		if _, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := a.pods.(cache.Indexer).Add(p); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, tm := range a.deadlines {
			tm.Stop()
		}
	})
	return a, client
}

func hostPortPod(name string, uid types.UID, ip string, proto corev1.Protocol, port int32) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: uid},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "web:1",
			Ports: []corev1.ContainerPort{{ContainerPort: 80, HostPort: port, HostIP: ip, Protocol: proto}}}}}}
}

// TestAdmitHostPortsAndSysctls: pods bound by nodeName past the scheduler go through the node's admission:
// one whose host port (same port and protocol, and the same IP or either 0.0.0.0) an admitted pod holds is
// rejected as the kubelet does (Failed, reason NodePorts, "Pod was rejected: ..."), and so is a pod with an
// unsafe sysctl (SysctlForbidden); neither runs. Another IP or protocol on the same port is admitted.
func TestAdmitHostPortsAndSysctls(t *testing.T) {
	rt := newSimulatedRuntime()
	unsafe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "unsafe", UID: "u-sysctl"},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "web:1"}},
			SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.msgmax", Value: "10000000000"}}}}}
	pods := []*corev1.Pod{
		hostPortPod("first", "u1", "", corev1.ProtocolTCP, 8080),
		hostPortPod("same-port", "u2", "127.0.0.1", corev1.ProtocolTCP, 8080),
		hostPortPod("udp", "u3", "", corev1.ProtocolUDP, 8080),
		hostPortPod("other-port", "u4", "", corev1.ProtocolTCP, 8081),
		unsafe,
	}
	a, client := admissionAgent(t, rt, pods...)
	ctx := context.Background()
	for _, p := range pods {
		if _, err := a.syncPod(ctx, "default/"+p.Name); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
	want := map[string]string{"first": "", "same-port": "NodePorts", "udp": "", "other-port": "", "unsafe": "SysctlForbidden"}
	for _, p := range pods {
		stored, err := client.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rt.mu.Lock()
		_, runs := rt.pods[p.UID]
		rt.mu.Unlock()
		reason := want[p.Name]
		if reason == "" {
			if stored.Status.Phase == corev1.PodFailed || !runs {
				t.Errorf("%s: phase %s, running %v; want it admitted and running", p.Name, stored.Status.Phase, runs)
			}
			continue
		}
		if stored.Status.Phase != corev1.PodFailed || stored.Status.Reason != reason || !strings.HasPrefix(stored.Status.Message, "Pod was rejected: ") || runs {
			t.Errorf("%s: phase %s, reason %q, message %q, running %v; want Failed, %s, rejected, not running",
				p.Name, stored.Status.Phase, stored.Status.Reason, stored.Status.Message, runs, reason)
		}
	}
	if stored, _ := client.CoreV1().Pods("default").Get(ctx, "same-port", metav1.GetOptions{}); stored.Status.Message !=
		"Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports" {
		t.Errorf("NodePorts message %q", stored.Status.Message)
	}
	// The rejected pod is never admitted later, though the informer still shows it Pending.
	if _, err := a.syncPod(ctx, "default/same-port"); err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	_, runs := rt.pods["u2"]
	rt.mu.Unlock()
	if runs {
		t.Error("the rejected pod runs after another sync")
	}
}

// TestActiveDeadline: a pod active on the node past its activeDeadlineSeconds is killed and Failed with
// reason DeadlineExceeded, its running containers ContainerStatusUnknown; a pod whose deadline is ahead runs
// and is woken at its deadline.
func TestActiveDeadline(t *testing.T) {
	rt := newSimulatedRuntime()
	deadline := int64(5)
	started := metav1.NewTime(time.Now().Add(-10 * time.Second))
	past := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "past", UID: "u1", Generation: 2},
		Spec: corev1.PodSpec{NodeName: "n1", ActiveDeadlineSeconds: &deadline, Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}
	ahead := past.DeepCopy()
	ahead.Name, ahead.UID = "ahead", "u2"
	later := int64(3600)
	ahead.Spec.ActiveDeadlineSeconds = &later
	a, client := admissionAgent(t, rt, past, ahead)
	ctx := context.Background()
	for _, name := range []string{"past", "ahead"} {
		if _, err := a.syncPod(ctx, "default/"+name); err != nil {
			t.Fatal(err)
		}
	}
	// Both run; then "past" has been active for 10 s (as its status says), past its 5 s.
	stored, err := client.CoreV1().Pods("default").Get(ctx, "past", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stored.Status.Phase != corev1.PodRunning {
		t.Fatalf("phase %s before the deadline", stored.Status.Phase)
	}
	stored.Status.StartTime = &started
	if err := a.pods.(cache.Indexer).Update(stored); err != nil {
		t.Fatal(err)
	}
	if _, err := a.syncPod(ctx, "default/past"); err != nil {
		t.Fatal(err)
	}
	stored, err = client.CoreV1().Pods("default").Get(ctx, "past", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stored.Status.Phase != corev1.PodFailed || stored.Status.Reason != "DeadlineExceeded" ||
		stored.Status.Message != "Pod was active on the node longer than the specified deadline" {
		t.Errorf("status %s %q %q; want Failed, DeadlineExceeded", stored.Status.Phase, stored.Status.Reason, stored.Status.Message)
	}
	if cs := stored.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.Reason != "ContainerStatusUnknown" || cs[0].Ready {
		t.Errorf("container statuses %+v", cs)
	}
	for _, c := range stored.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionFalse {
			t.Errorf("Ready %s after the deadline", c.Status)
		}
	}
	rt.mu.Lock()
	_, pastRuns := rt.pods["u1"]
	_, aheadRuns := rt.pods["u2"]
	rt.mu.Unlock()
	if pastRuns || !aheadRuns {
		t.Errorf("past running %v, ahead running %v; want false, true", pastRuns, aheadRuns)
	}
	// The informer's copy of "ahead" has no start time yet; with the one written, its wake-up is set.
	aheadStored, _ := client.CoreV1().Pods("default").Get(ctx, "ahead", metav1.GetOptions{})
	_ = a.pods.(cache.Indexer).Update(aheadStored)
	if _, err := a.syncPod(ctx, "default/ahead"); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	woken := a.deadlines["default/ahead"] != nil
	a.mu.Unlock()
	if !woken {
		t.Error("no wake-up at the deadline of the pod whose deadline is ahead")
	}
}

// TestDeletedPodEndsTerminal: a pod killed for its deletion gets a terminal phase before it goes, as the
// kubelet's TerminatePod gives it: a running pod ends Failed with its containers ContainerStatusUnknown, so a
// finalizer's holder (the Job controller, for an evicted pod) sees how it ended.
func TestDeletedPodEndsTerminal(t *testing.T) {
	rt := newSimulatedRuntime()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "evicted", UID: "u1", Finalizers: []string{"batch.kubernetes.io/job-tracking"}},
		Spec: corev1.PodSpec{NodeName: "n1", RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	a, client := admissionAgent(t, rt, pod)
	ctx := context.Background()
	if _, err := a.syncPod(ctx, "default/evicted"); err != nil {
		t.Fatal(err)
	}
	running, err := client.CoreV1().Pods("default").Get(ctx, "evicted", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if running.Status.Phase != corev1.PodRunning {
		t.Fatalf("phase %s before the deletion", running.Status.Phase)
	}
	now := metav1.Now()
	running.DeletionTimestamp = &now
	if err := a.pods.(cache.Indexer).Update(running); err != nil {
		t.Fatal(err)
	}
	if _, err := a.syncPod(ctx, "default/evicted"); err != nil {
		t.Fatal(err)
	}
	// The fake clientset deletes at once whatever the finalizers: read the last status the agent wrote.
	var stored *corev1.Pod
	for _, action := range client.Actions() {
		if u, ok := action.(k8stesting.UpdateAction); ok && action.GetSubresource() == "status" {
			stored = u.GetObject().(*corev1.Pod)
		}
	}
	if stored == nil {
		t.Fatal("no status written")
	}
	if stored.Status.Phase != corev1.PodFailed {
		t.Errorf("phase %s after the deletion's kill; want Failed", stored.Status.Phase)
	}
	if cs := stored.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.Reason != "ContainerStatusUnknown" {
		t.Errorf("container statuses %+v", cs)
	}
	rt.mu.Lock()
	_, runs := rt.pods["u1"]
	rt.mu.Unlock()
	if runs {
		t.Error("the deleted pod still runs")
	}
}
