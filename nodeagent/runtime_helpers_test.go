package nodeagent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/remotes/docker"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/config"
)

// Container statuses for the phase tables.
func csRunning() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
}
func csExited(code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
}
func csWaiting() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
}
func csCrashLoop(lastCode int32) corev1.ContainerStatus {
	s := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}
	s.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: lastCode}
	return s
}

func TestPodPhase(t *testing.T) {
	type cs = []corev1.ContainerStatus
	const always, onFailure, never = corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever
	tests := []struct {
		name        string
		policy      corev1.RestartPolicy
		init, ctrs  cs
		initialized bool
		want        corev1.PodPhase
	}{
		{"no containers yet", always, nil, nil, true, corev1.PodPending},
		{"init container running", always, cs{csRunning()}, cs{csWaiting()}, false, corev1.PodPending},
		{"init container failed, Never", never, cs{csExited(1)}, cs{csWaiting()}, false, corev1.PodFailed},
		{"init container failed, OnFailure", onFailure, cs{csExited(1)}, cs{csWaiting()}, false, corev1.PodPending},
		{"init container failed, Always", always, cs{csExited(2)}, cs{csWaiting()}, false, corev1.PodPending},
		{"second init pending after first succeeded", never, cs{csExited(0), csWaiting()}, cs{csWaiting()}, false, corev1.PodPending},
		{"container never started", always, nil, cs{csWaiting()}, true, corev1.PodPending},
		{"container without any state", always, nil, cs{{}}, true, corev1.PodPending},
		{"one running, one not started", always, nil, cs{csRunning(), csWaiting()}, true, corev1.PodPending},
		{"all running", always, cs{csExited(0)}, cs{csRunning(), csRunning()}, true, corev1.PodRunning},
		{"one running, one exited", never, nil, cs{csRunning(), csExited(1)}, true, corev1.PodRunning},
		{"crash loop is Running", always, nil, cs{csCrashLoop(1)}, true, corev1.PodRunning},
		{"crash loop next to a running one", always, nil, cs{csRunning(), csCrashLoop(137)}, true, corev1.PodRunning},
		{"all stopped, Always", always, nil, cs{csExited(0), csExited(1)}, true, corev1.PodRunning},
		{"all exited 0, Always restarts them", always, nil, cs{csExited(0)}, true, corev1.PodRunning},
		{"all exited 0, OnFailure", onFailure, nil, cs{csExited(0), csExited(0)}, true, corev1.PodSucceeded},
		{"all exited 0, Never", never, nil, cs{csExited(0)}, true, corev1.PodSucceeded},
		{"one failed, Never", never, nil, cs{csExited(0), csExited(3)}, true, corev1.PodFailed},
		{"one failed, OnFailure restarts it", onFailure, nil, cs{csExited(0), csExited(3)}, true, corev1.PodRunning},
		{"failed and waiting to restart, OnFailure", onFailure, nil, cs{csExited(0), csCrashLoop(1)}, true, corev1.PodRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := &PodState{InitContainers: tt.init, Containers: tt.ctrs}
			if got := podPhase(tt.policy, state, tt.initialized); got != tt.want {
				t.Errorf("podPhase = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestPodStatusConditions(t *testing.T) {
	ready := func(s corev1.ContainerStatus) corev1.ContainerStatus { s.Ready = true; return s }
	type conds = map[corev1.PodConditionType]corev1.ConditionStatus
	T, F := corev1.ConditionTrue, corev1.ConditionFalse
	tests := []struct {
		name  string
		state PodState
		phase corev1.PodPhase
		want  conds
	}{
		{"sandbox not ready", PodState{Containers: []corev1.ContainerStatus{csWaiting()}}, corev1.PodPending,
			conds{corev1.PodReadyToStartContainers: F, corev1.PodInitialized: T, corev1.ContainersReady: F, corev1.PodReady: F, corev1.PodScheduled: T}},
		{"init container running", PodState{SandboxReady: true, InitContainers: []corev1.ContainerStatus{csRunning()},
			Containers: []corev1.ContainerStatus{csWaiting()}}, corev1.PodPending,
			conds{corev1.PodReadyToStartContainers: T, corev1.PodInitialized: F, corev1.ContainersReady: F, corev1.PodReady: F, corev1.PodScheduled: T}},
		{"running, one not ready", PodState{SandboxReady: true, InitContainers: []corev1.ContainerStatus{csExited(0)},
			Containers: []corev1.ContainerStatus{ready(csRunning()), csRunning()}}, corev1.PodRunning,
			conds{corev1.PodReadyToStartContainers: T, corev1.PodInitialized: T, corev1.ContainersReady: F, corev1.PodReady: F, corev1.PodScheduled: T}},
		{"all ready", PodState{SandboxReady: true, IP: "10.42.0.7", Containers: []corev1.ContainerStatus{ready(csRunning()), ready(csRunning())}},
			corev1.PodRunning, conds{corev1.PodReadyToStartContainers: T, corev1.PodInitialized: T, corev1.ContainersReady: T, corev1.PodReady: T, corev1.PodScheduled: T}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways}}
			// The spec names the containers the statuses report, as the kubelet's condition rules read it.
			for i := range tt.state.InitContainers {
				tt.state.InitContainers[i].Name = fmt.Sprintf("init%d", i)
				pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{Name: tt.state.InitContainers[i].Name})
			}
			for i := range tt.state.Containers {
				tt.state.Containers[i].Name = fmt.Sprintf("app%d", i)
				pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: tt.state.Containers[i].Name})
			}
			tt.state.Started = time.Unix(1000, 0)
			st := podStatus(pod, &tt.state, "192.168.1.10")
			if st.Phase != tt.phase {
				t.Errorf("phase %s, want %s", st.Phase, tt.phase)
			}
			got := conds{}
			for _, c := range st.Conditions {
				got[c.Type] = c.Status
			}
			if !reflect.DeepEqual(got, tt.want) || len(st.Conditions) != 5 {
				t.Errorf("conditions %v, want %v", st.Conditions, tt.want)
			}
			if st.HostIP != "192.168.1.10" || !reflect.DeepEqual(st.HostIPs, []corev1.HostIP{{IP: "192.168.1.10"}}) {
				t.Errorf("host IPs %q %v", st.HostIP, st.HostIPs)
			}
			if st.PodIP != tt.state.IP || (tt.state.IP != "" && !reflect.DeepEqual(st.PodIPs, []corev1.PodIP{{IP: tt.state.IP}})) {
				t.Errorf("pod IPs %q %v", st.PodIP, st.PodIPs)
			}
			if st.StartTime == nil || !st.StartTime.Time.Equal(time.Unix(1000, 0)) {
				t.Errorf("start time %v", st.StartTime)
			}
		})
	}
}

func TestPodStatusKeepsTransitionTimes(t *testing.T) {
	old := metav1.NewTime(time.Unix(500, 0))
	start := metav1.NewTime(time.Unix(100, 0))
	pod := &corev1.Pod{Status: corev1.PodStatus{StartTime: &start, PodIP: "10.42.0.9", Conditions: []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: old},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: old},
		{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, LastTransitionTime: old},
		{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: old},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: old},
	}}}
	c := csRunning()
	c.Ready = true
	st := podStatus(pod, &PodState{SandboxReady: true, Started: time.Unix(2000, 0), Containers: []corev1.ContainerStatus{c}}, "192.168.1.10")
	if len(st.Conditions) != 5 {
		t.Fatalf("conditions %v", st.Conditions)
	}
	for _, c := range st.Conditions {
		changed := c.Type == corev1.ContainersReady || c.Type == corev1.PodReady
		if c.Status != corev1.ConditionTrue || c.LastTransitionTime.Equal(&old) == changed {
			t.Errorf("condition %s = %s at %v (changed: %v)", c.Type, c.Status, c.LastTransitionTime, changed)
		}
	}
	if !st.StartTime.Equal(&start) || st.PodIP != "10.42.0.9" {
		t.Errorf("start time %v, pod IP %q: both should be kept", st.StartTime, st.PodIP)
	}
	if pod.Status.Conditions[3].Status != corev1.ConditionFalse {
		t.Error("podStatus modified the pod's own status")
	}
}

func TestAgentRelevantChange(t *testing.T) {
	grace := int64(30)
	deleted := metav1.NewTime(time.Unix(7, 0))
	base := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u1", ResourceVersion: "1",
			DeletionTimestamp: &deleted, DeletionGracePeriodSeconds: &grace,
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "1"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "web:1",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	tests := []struct {
		name   string
		mutate func(p *corev1.Pod)
		want   bool
	}{
		{"nothing", func(p *corev1.Pod) {}, false},
		{"resourceVersion", func(p *corev1.Pod) { p.ResourceVersion = "2" }, false},
		{"status conditions", func(p *corev1.Pod) { p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady}} }, false},
		{"container statuses and IP", func(p *corev1.Pod) {
			p.Status.PodIP, p.Status.ContainerStatuses = "10.0.0.1", []corev1.ContainerStatus{csRunning()}
		}, false},
		{"same quantity spelled differently", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1000m")
		}, false},
		{"same deletionTimestamp, another pointer", func(p *corev1.Pod) {
			ts := metav1.NewTime(time.Unix(7, 0))
			p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &ts, ptr(grace)
		}, false},
		{"spec image", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "web:2" }, true},
		{"spec activeDeadlineSeconds", func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = ptr(int64(5)) }, true},
		{"label added", func(p *corev1.Pod) { p.Labels["tier"] = "front" }, true},
		{"annotation changed", func(p *corev1.Pod) { p.Annotations["a"] = "2" }, true},
		{"deletionTimestamp moved", func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }, true},
		{"deletionTimestamp cleared", func(p *corev1.Pod) { p.DeletionTimestamp = nil }, true},
		{"deletionGracePeriodSeconds shortened", func(p *corev1.Pod) { p.DeletionGracePeriodSeconds = ptr(int64(0)) }, true},
		{"deletionGracePeriodSeconds cleared", func(p *corev1.Pod) { p.DeletionGracePeriodSeconds = nil }, true},
		{"UID", func(p *corev1.Pod) { p.UID = "u2" }, true},
		{"phase", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, cur := base.DeepCopy(), base.DeepCopy()
			tt.mutate(cur)
			if got := agentRelevantChange(old, cur); got != tt.want {
				t.Errorf("agentRelevantChange = %v, want %v", got, tt.want)
			}
		})
	}
	old, cur := base.DeepCopy(), base.DeepCopy()
	old.Labels, cur.Labels = nil, map[string]string{}
	if agentRelevantChange(old, cur) {
		t.Error("nil and empty labels count as a change")
	}
	old.DeletionTimestamp, old.DeletionGracePeriodSeconds = nil, nil
	if !agentRelevantChange(old, cur) {
		t.Error("the start of a deletion does not count as a change")
	}
}

func TestExpandAll(t *testing.T) {
	env := []string{"A=alpha", "B=", "EQ=x=y", "REF=$(A)", "A2=first", "A2=second"}
	tests := []struct{ in, want string }{
		{"$(A)", "alpha"},
		{"pre-$(A)-post", "pre-alpha-post"},
		{"$(A)$(EQ)", "alphax=y"},
		{"$(B)", ""},
		{"$(REF)", "$(A)"}, // values are not expanded again
		{"$(A2)", "second"},
		{"$(NOPE)", "$(NOPE)"},
		{"$$(A)", "$(A)"},
		{"$$$(A)", "$alpha"},
		{"cost: $$5", "cost: $5"},
		{"$A ${A}", "$A ${A}"},
		{"$(A", "$(A"},
		{"x $(", "x $("},
		{"trailing $", "trailing $"},
		{"$()", "$()"},
		{"$(A)$(A", "alpha$(A"},
		{"$(unterminated $$", "$(unterminated $"}, // the kubelet still unescapes $$ after an unterminated $(
	}
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := expandAll([]string{tt.in}, env)
			if len(got) != 1 || got[0] != tt.want {
				t.Errorf("expandAll(%q) = %q, want %q", tt.in, got, tt.want)
			}
			// The command/args expansion must agree with the env expansion, which follows the kubelet.
			ref := expandVars(tt.in, func(n string) string {
				if v, ok := vars[n]; ok {
					return v
				}
				return "$(" + n + ")"
			})
			if got[0] != ref {
				t.Errorf("expandAll(%q) = %q, but expandVars gives %q", tt.in, got[0], ref)
			}
		})
	}
	if got := expandAll([]string{"$(A)", "b", "$(B)c"}, env); !reflect.DeepEqual(got, []string{"alpha", "b", "c"}) {
		t.Errorf("expandAll of several = %q", got)
	}
	if got := expandAll(nil, env); len(got) != 0 {
		t.Errorf("expandAll(nil) = %q", got)
	}
}

// genSpec applies opts to containerd's default spec, as containerd.WithNewSpec does.
func genSpec(t *testing.T, opts []oci.SpecOpts) (*oci.Spec, error) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	return oci.GenerateSpec(ctx, nil, &containers.Container{ID: "x"}, opts...)
}

func TestResourceOpts(t *testing.T) {
	rl := func(kv ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	tests := []struct {
		name     string
		req, lim corev1.ResourceList
		shares   uint64
		quota    int64 // 0: no quota
		memory   int64 // 0: no limit
	}{
		{name: "best effort", shares: 2},
		{name: "100m request", req: rl("cpu", "100m"), shares: 102},
		{name: "1m request is the minimum", req: rl("cpu", "1m"), shares: 2},
		{name: "2 CPUs request", req: rl("cpu", "2"), shares: 2048},
		{name: "request and limit", req: rl("cpu", "250m"), lim: rl("cpu", "500m"), shares: 256, quota: 50000},
		{name: "limit only defaults the request", lim: rl("cpu", "500m"), shares: 512, quota: 50000},
		{name: "zero request with a limit", req: rl("cpu", "0"), lim: rl("cpu", "1500m"), shares: 2, quota: 150000},
		{name: "tiny limit gets the 1ms minimum quota", lim: rl("cpu", "5m"), shares: 5, quota: 1000},
		{name: "memory limit", req: rl("memory", "64Mi"), lim: rl("memory", "128Mi"), shares: 2, memory: 128 << 20},
		{name: "shares capped at 262144", req: rl("cpu", "300"), shares: 262144},
		{name: "zero CPU limit means no quota", lim: rl("cpu", "0"), shares: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &corev1.Container{Resources: corev1.ResourceRequirements{Requests: tt.req, Limits: tt.lim}}
			s, err := genSpec(t, resourceOpts(c))
			if err != nil {
				t.Fatal(err)
			}
			res := s.Linux.Resources
			if res.CPU == nil || res.CPU.Shares == nil || *res.CPU.Shares != tt.shares {
				t.Errorf("cpu %+v, want shares %d", res.CPU, tt.shares)
			}
			switch {
			case tt.quota == 0 && res.CPU != nil && res.CPU.Quota != nil:
				t.Errorf("quota %d, want none", *res.CPU.Quota)
			case tt.quota != 0 && (res.CPU.Quota == nil || *res.CPU.Quota != tt.quota || res.CPU.Period == nil || *res.CPU.Period != 100000):
				t.Errorf("quota %v over %v, want %d over 100000", res.CPU.Quota, res.CPU.Period, tt.quota)
			}
			switch {
			case tt.memory == 0 && res.Memory != nil && res.Memory.Limit != nil:
				t.Errorf("memory limit %d, want none", *res.Memory.Limit)
			case tt.memory != 0 && (res.Memory == nil || res.Memory.Limit == nil || *res.Memory.Limit != tt.memory):
				t.Errorf("memory %+v, want limit %d", res.Memory, tt.memory)
			}
		})
	}
}

func TestSecurityOpts(t *testing.T) {
	id := func(v int64) *int64 { return &v }
	caps := func(add []corev1.Capability, drop ...corev1.Capability) *corev1.SecurityContext {
		return &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: add, Drop: drop}}
	}
	user := func(uid, gid uint32) func(s *oci.Spec) bool {
		return func(s *oci.Spec) bool { return s.Process.User.UID == uid && s.Process.User.GID == gid }
	}
	bounding := func(has, lacks []string) func(s *oci.Spec) bool {
		return func(s *oci.Spec) bool {
			b := s.Process.Capabilities.Bounding
			return !slices.ContainsFunc(has, func(c string) bool { return !slices.Contains(b, c) }) &&
				!slices.ContainsFunc(lacks, func(c string) bool { return slices.Contains(b, c) })
		}
	}
	tests := []struct {
		name    string
		psc     *corev1.PodSecurityContext
		csc     *corev1.SecurityContext
		wantErr bool
		check   func(s *oci.Spec) bool
	}{
		{name: "pod user and group", psc: &corev1.PodSecurityContext{RunAsUser: id(1000), RunAsGroup: id(3000)}, check: user(1000, 3000)},
		{name: "container overrides the pod", psc: &corev1.PodSecurityContext{RunAsUser: id(1000), RunAsGroup: id(3000)},
			csc: &corev1.SecurityContext{RunAsUser: id(2000)}, check: user(2000, 3000)},
		{name: "group only", csc: &corev1.SecurityContext{RunAsGroup: id(42)}, check: user(0, 42)},
		{name: "supplemental groups and fsGroup", psc: &corev1.PodSecurityContext{RunAsUser: id(1), RunAsGroup: id(2),
			SupplementalGroups: []int64{10, 20}, FSGroup: id(30)},
			check: func(s *oci.Spec) bool {
				g := s.Process.User.AdditionalGids
				return slices.Contains(g, 10) && slices.Contains(g, 20) && slices.Contains(g, 30)
			}},
		{name: "add and drop", csc: caps([]corev1.Capability{"NET_ADMIN", "cap_sys_time"}, "CHOWN"),
			check: bounding([]string{"CAP_NET_ADMIN", "CAP_SYS_TIME", "CAP_KILL"}, []string{"CAP_CHOWN"})},
		{name: "drop ALL then add", csc: caps([]corev1.Capability{"NET_BIND_SERVICE"}, "all"),
			check: func(s *oci.Spec) bool {
				c, want := s.Process.Capabilities, []string{"CAP_NET_BIND_SERVICE"}
				return slices.Equal(c.Bounding, want) && slices.Equal(c.Effective, want) && slices.Equal(c.Permitted, want)
			}},
		{name: "drop ALL", csc: caps(nil, "ALL"), check: func(s *oci.Spec) bool {
			c := s.Process.Capabilities
			return len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable) == 0
		}},
		{name: "add ALL", csc: caps([]corev1.Capability{"ALL"}), check: bounding([]string{"CAP_SYS_ADMIN"}, []string{"CAP_ALL"})},
		{name: "allowPrivilegeEscalation false", csc: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(false)},
			check: func(s *oci.Spec) bool { return s.Process.NoNewPrivileges }},
		{name: "allowPrivilegeEscalation true", csc: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(true)},
			check: func(s *oci.Spec) bool { return !s.Process.NoNewPrivileges }},
		{name: "readOnlyRootFilesystem", csc: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr(true)},
			check: func(s *oci.Spec) bool { return s.Root.Readonly }},
		{name: "runAsNonRoot with a non-root user", psc: &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: id(1000), RunAsGroup: id(1000)}},
		{name: "runAsNonRoot with root", psc: &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: id(0), RunAsGroup: id(0)}, wantErr: true},
		{name: "container runAsNonRoot with the pod's root user", psc: &corev1.PodSecurityContext{RunAsUser: id(0), RunAsGroup: id(0)},
			csc: &corev1.SecurityContext{RunAsNonRoot: ptr(true)}, wantErr: true},
		{name: "container lifts the pod's runAsNonRoot", psc: &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: id(0), RunAsGroup: id(0)},
			csc: &corev1.SecurityContext{RunAsNonRoot: ptr(false)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: tt.psc}}
			opts, err := securityOpts(pod, &corev1.Container{Name: "c", SecurityContext: tt.csc})
			if err != nil {
				t.Fatal(err)
			}
			s, err := genSpec(t, opts)
			if (err != nil) != tt.wantErr {
				t.Fatalf("spec error %v, want error: %v", err, tt.wantErr)
			}
			if err == nil && tt.check != nil && !tt.check(s) {
				t.Errorf("unexpected spec: process %+v, capabilities %+v, root %+v", s.Process, s.Process.Capabilities, s.Root)
			}
		})
	}
}

func TestCapNamesAndDropAll(t *testing.T) {
	if got := capNames([]corev1.Capability{"NET_ADMIN", "cap_chown", "CAP_KILL", "sys_time"}); !reflect.DeepEqual(got,
		[]string{"CAP_NET_ADMIN", "CAP_CHOWN", "CAP_KILL", "CAP_SYS_TIME"}) {
		t.Errorf("capNames = %v", got)
	}
	if got := capNames(nil); got == nil || len(got) != 0 {
		t.Errorf("capNames(nil) = %#v", got)
	}
	for _, tt := range []struct {
		in   []corev1.Capability
		want bool
	}{{nil, false}, {[]corev1.Capability{"CHOWN"}, false}, {[]corev1.Capability{"CHOWN", "ALL"}, true}, {[]corev1.Capability{"all"}, true},
		{[]corev1.Capability{"CAP_ALL"}, false}} {
		if got := dropAll(tt.in); got != tt.want {
			t.Errorf("dropAll(%v) = %v", tt.in, got)
		}
	}
}

func TestStopSignal(t *testing.T) {
	tests := []struct {
		in   string
		want syscall.Signal
		why  string
	}{
		{"", syscall.SIGTERM, ""}, {"SIGQUIT", syscall.SIGQUIT, ""}, {"QUIT", syscall.SIGQUIT, ""}, {"3", syscall.SIGQUIT, ""},
		{"SIGKILL", syscall.SIGKILL, ""}, {"INT", syscall.SIGINT, ""}, {"garbage", syscall.SIGTERM, ""}, {"0", syscall.SIGTERM, ""},
		{"-9", syscall.SIGTERM, ""}, {"SIGNOPE", syscall.SIGTERM, ""},
		{"sigquit", syscall.SIGQUIT, "containerd and Docker read signal names case-insensitively"},
		{"SIGRTMIN+3", syscall.Signal(37), "systemd images stop with SIGRTMIN+3, which containerd maps to 34+3"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := stopSignal(tt.in); got != tt.want {
				t.Errorf("stopSignal(%q) = %v, want %v %s", tt.in, got, tt.want, tt.why)
			}
		})
	}
}

func TestNormalizeRef(t *testing.T) {
	const dgst = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct{ in, want string }{
		{"busybox", "docker.io/library/busybox:latest"},
		{"busybox:1.36", "docker.io/library/busybox:1.36"},
		{"library/busybox", "docker.io/library/busybox:latest"},
		{"user/app", "docker.io/user/app:latest"},
		{"docker.io/library/busybox:1", "docker.io/library/busybox:1"},
		{"127.0.0.1:5000/a/b:1", "127.0.0.1:5000/a/b:1"},
		{"localhost:5000/app", "localhost:5000/app:latest"},
		{"ghcr.io/org/app@" + dgst, "ghcr.io/org/app@" + dgst},
		{"busybox:1@" + dgst, "docker.io/library/busybox@" + dgst},
		{"", ""}, {"Busybox", ""}, {"busybox:", ""}, {"bad name", ""}, {"busybox@sha256:abc", ""}, {"a//b", ""},
	}
	for _, tt := range tests {
		got, err := normalizeRef(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("normalizeRef(%q) = %q, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("normalizeRef(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// basicAuth runs host's authorizer through a Basic challenge and returns the "user:pass" it then sends, or
// "" when it has no credentials.
func basicAuth(t *testing.T, h docker.RegistryHost) string {
	t.Helper()
	ctx := context.Background()
	req, _ := http.NewRequest(http.MethodGet, h.Scheme+"://"+h.Host+"/v2/", nil)
	resp := &http.Response{StatusCode: http.StatusUnauthorized, Request: req, Header: http.Header{"Www-Authenticate": {`Basic realm="test"`}}}
	if err := h.Authorizer.AddResponses(ctx, []*http.Response{resp}); err != nil {
		return ""
	}
	req, _ = http.NewRequest(http.MethodGet, h.Scheme+"://"+h.Host+"/v2/x/manifests/y", nil)
	if err := h.Authorizer.Authorize(ctx, req); err != nil {
		t.Fatal(err)
	}
	user, pass, _ := req.BasicAuth()
	if user == "" {
		return ""
	}
	return user + ":" + pass
}

func TestRegistryHosts(t *testing.T) {
	regs := []config.Registry{
		{Host: "plain.local:5000", PlainHTTP: true},
		{Host: "self-signed.local", InsecureSkipVerify: true},
		{Host: "mirrored.io", Endpoints: []string{"http://mirror.local:5000", "mirror2.local", "docker.io"}},
		{Host: "localhost:6000"}, // configured without plain_http: HTTPS
		{Host: "private.io", Username: "op", Password: "secret"},
	}
	var asked []string
	creds := func(host string) (string, string, error) {
		asked = append(asked, host)
		return "pod-user", "pod-pass", nil
	}
	hosts := registryHosts(regs, creds)
	type ep struct{ scheme, host string }
	tests := []struct {
		host     string
		want     []ep
		insecure bool
		auth     string
	}{
		{"registry.example.com", []ep{{"https", "registry.example.com"}}, false, "pod-user:pod-pass"},
		{"localhost:5000", []ep{{"http", "localhost:5000"}}, false, "pod-user:pod-pass"},
		{"127.0.0.1:5000", []ep{{"http", "127.0.0.1:5000"}}, false, "pod-user:pod-pass"},
		{"[::1]:5000", []ep{{"http", "[::1]:5000"}}, false, "pod-user:pod-pass"},
		{"docker.io", []ep{{"https", "registry-1.docker.io"}}, false, "pod-user:pod-pass"},
		{"plain.local:5000", []ep{{"http", "plain.local:5000"}}, false, "pod-user:pod-pass"},
		{"self-signed.local", []ep{{"https", "self-signed.local"}}, true, "pod-user:pod-pass"},
		{"mirrored.io", []ep{{"http", "mirror.local:5000"}, {"https", "mirror2.local"}, {"https", "registry-1.docker.io"}}, false, "pod-user:pod-pass"},
		{"localhost:6000", []ep{{"https", "localhost:6000"}}, false, "pod-user:pod-pass"},
		{"private.io", []ep{{"https", "private.io"}}, false, "op:secret"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			got, err := hosts(tt.host)
			if err != nil {
				t.Fatal(err)
			}
			var eps []ep
			for _, h := range got {
				eps = append(eps, ep{h.Scheme, h.Host})
				if h.Path != "/v2" || h.Capabilities != docker.HostCapabilityPull|docker.HostCapabilityResolve {
					t.Errorf("%s: path %q, capabilities %v", h.Host, h.Path, h.Capabilities)
				}
				tr, ok := h.Client.Transport.(*http.Transport)
				if !ok || (tr.TLSClientConfig != nil && tr.TLSClientConfig.InsecureSkipVerify) != tt.insecure {
					t.Errorf("%s: transport %T, insecure want %v", h.Host, h.Client.Transport, tt.insecure)
				}
				asked = nil
				if a := basicAuth(t, h); a != tt.auth {
					t.Errorf("%s: credentials %q, want %q", h.Host, a, tt.auth)
				}
				if tt.auth == "pod-user:pod-pass" && !reflect.DeepEqual(asked, []string{tt.host}) {
					t.Errorf("%s: pull-secret credentials asked for %v, want the registry host %q", h.Host, asked, tt.host)
				}
			}
			if !reflect.DeepEqual(eps, tt.want) {
				t.Errorf("endpoints %v, want %v", eps, tt.want)
			}
		})
	}
	if got, _ := registryHosts(nil, nil)("registry.example.com"); len(got) != 1 || basicAuth(t, got[0]) != "" {
		t.Error("without credentials the authorizer should send none")
	}
}

func TestPullSecretCreds(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	js := func(v any) []byte { b, _ := json.Marshal(v); return b }
	objs := newFakeObjects()
	objs.addSecret("ns", "json", map[string][]byte{corev1.DockerConfigJsonKey: js(map[string]any{"auths": map[string]any{
		"registry.example.com":          map[string]string{"username": "u1", "password": "p1"},
		"https://auth.example.com/v1/":  map[string]string{"auth": b64("u2:pa:ss")},
		"http://plain.example.com:5000": map[string]string{"username": "u3", "password": "p3"},
		"both.example.com":              map[string]string{"username": "ignored", "password": "ignored", "auth": b64("u4:p4")},
	}})})
	objs.addSecret("ns", "legacy", map[string][]byte{corev1.DockerConfigKey: js(map[string]any{
		"legacy.example.com":   map[string]string{"auth": b64("u5:p5")},
		"registry.example.com": map[string]string{"username": "second", "password": "loses"},
	})})
	objs.addSecret("ns", "hub", map[string][]byte{corev1.DockerConfigJsonKey: js(map[string]any{"auths": map[string]any{
		"https://index.docker.io/v1/": map[string]string{"username": "hubuser", "password": "hubpass"},
	}})})
	objs.addSecret("other", "json", map[string][]byte{corev1.DockerConfigJsonKey: js(map[string]any{"auths": map[string]any{
		"other-ns.example.com": map[string]string{"username": "x", "password": "y"},
	}})})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}, Spec: corev1.PodSpec{
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "missing"}, {Name: "json"}, {Name: "legacy"}, {Name: "hub"}}}}
	creds := pullSecretCreds(context.Background(), pod, objs)
	tests := []struct{ host, user, pass string }{
		{"registry.example.com", "u1", "p1"},
		{"auth.example.com", "u2", "pa:ss"},
		{"plain.example.com:5000", "u3", "p3"},
		{"both.example.com", "u4", "p4"},
		{"legacy.example.com", "u5", "p5"},
		{"other-ns.example.com", "", ""},
		{"unknown.example.com", "", ""},
		// Keyed "https://index.docker.io/v1/", as docker login and kubectl create secret docker-registry write.
		{"docker.io", "hubuser", "hubpass"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			user, pass, err := creds(tt.host)
			if err != nil || user != tt.user || pass != tt.pass {
				t.Errorf("creds(%q) = %q, %q, %v; want %q, %q", tt.host, user, pass, err, tt.user, tt.pass)
			}
		})
	}
}

func TestPodHostname(t *testing.T) {
	long := strings.Repeat("a", 70)
	dashAt62 := strings.Repeat("b", 61) + "-.c" + strings.Repeat("d", 5)
	tests := []struct {
		name, hostname, want string
	}{
		{"web-0", "", "web-0"},
		{"web-0", "custom", "custom"},
		{long, "", long[:63]},
		{"x", long, long[:63]},
		{dashAt62, "", strings.Repeat("b", 61)},
		{strings.Repeat("c", 63), "", strings.Repeat("c", 63)},
	}
	for _, tt := range tests {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: tt.name}, Spec: corev1.PodSpec{Hostname: tt.hostname}}
		if got := podHostname(pod); got != tt.want {
			t.Errorf("podHostname(%q, %q) = %q, want %q", tt.name, tt.hostname, got, tt.want)
		}
	}
}

func TestWritePodDNSFiles(t *testing.T) {
	hostResolv, _ := os.ReadFile("/etc/resolv.conf")
	tests := []struct {
		name           string
		spec           corev1.PodSpec
		hostsHas       []string
		hostsLacks     []string
		resolv         string // exact, after the host's resolv.conf when hostResolv
		withHostResolv bool
	}{
		{name: "plain pod", spec: corev1.PodSpec{DNSPolicy: corev1.DNSClusterFirst},
			hostsHas: []string{"127.0.0.1\tlocalhost\n", "10.42.0.5\tweb\n"}, withHostResolv: true},
		{name: "subdomain", spec: corev1.PodSpec{Subdomain: "svc1"},
			hostsHas: []string{"10.42.0.5\tweb.svc1.ns.svc.cluster.local\tweb\n"}, withHostResolv: true},
		{name: "hostAliases", spec: corev1.PodSpec{HostAliases: []corev1.HostAlias{{IP: "1.2.3.4", Hostnames: []string{"foo", "foo.local"}},
			{IP: "5.6.7.8", Hostnames: []string{"bar"}}}},
			hostsHas: []string{"10.42.0.5\tweb\n", "1.2.3.4\tfoo\tfoo.local\n", "5.6.7.8\tbar\n"}, withHostResolv: true},
		{name: "DNSNone with dnsConfig", spec: corev1.PodSpec{DNSPolicy: corev1.DNSNone, DNSConfig: &corev1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1", "8.8.8.8"}, Searches: []string{"a.local", "b.local"},
			Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("2")}, {Name: "edns0"}}}},
			resolv: "nameserver 1.1.1.1\nnameserver 8.8.8.8\nsearch a.local b.local\noptions ndots:2 edns0\n"},
		{name: "DNSNone without dnsConfig", spec: corev1.PodSpec{DNSPolicy: corev1.DNSNone}},
		{name: "hostNetwork", spec: corev1.PodSpec{HostNetwork: true}, hostsLacks: []string{"10.42.0.5"}, withHostResolv: true},
		{name: "hostNetwork keeps the node's hosts", spec: corev1.PodSpec{HostNetwork: true}, withHostResolv: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pod")
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"}, Spec: tt.spec}
			if err := writePodDNSFiles(dir, pod, "10.42.0.5", "web", clusterDNS{}); err != nil {
				t.Fatal(err)
			}
			read := func(name string) string {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				return string(b)
			}
			hosts := read("etc-hosts")
			if !strings.HasPrefix(hosts, "# Kubernetes-managed hosts file") {
				t.Errorf("hosts file lacks the header:\n%s", hosts)
			}
			for _, s := range tt.hostsHas {
				if !strings.Contains(hosts, s) {
					t.Errorf("hosts file lacks %q:\n%s", s, hosts)
				}
			}
			for _, s := range tt.hostsLacks {
				if strings.Contains(hosts, s) {
					t.Errorf("hosts file has %q:\n%s", s, hosts)
				}
			}
			if tt.spec.HostNetwork {
				node, err := os.ReadFile("/etc/hosts")
				if err != nil {
					t.Skip("no /etc/hosts on this host")
				}
				for _, line := range strings.Split(string(node), "\n") {
					if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") && !strings.Contains(hosts, line) {
						t.Errorf("hosts file lacks the node's %q", line)
					}
				}
			}
			if h := read("etc-hostname"); h != "web\n" {
				t.Errorf("hostname file %q", h)
			}
			want := tt.resolv
			if tt.withHostResolv {
				want = parseResolvConf(hostResolv).String() + want
			}
			if got := read("etc-resolv.conf"); got != want {
				t.Errorf("resolv.conf:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestBridgeName(t *testing.T) {
	a := bridgeName("node-1", "/var/lib/skiff")
	if len(a) > 15 || !strings.HasPrefix(a, "skiff") {
		t.Errorf("bridge name %q: longer than 15 bytes or badly named", a)
	}
	if b := bridgeName("node-1", "/var/lib/skiff"); b != a {
		t.Errorf("not stable: %q then %q", a, b)
	}
	long := bridgeName(strings.Repeat("n", 300), strings.Repeat("/d", 300))
	if len(long) > 15 {
		t.Errorf("bridge name %q for long inputs is longer than 15 bytes", long)
	}
	seen := map[string]string{a: "node-1 /var/lib/skiff"}
	for _, in := range [][2]string{{"node-1", "/var/lib/skiff2"}, {"node-2", "/var/lib/skiff"}, {"node-1/", "var/lib/skiff"}, {"", ""}} {
		name := bridgeName(in[0], in[1])
		if prev, dup := seen[name]; dup {
			t.Errorf("bridgeName(%q, %q) = %q, same as for %s", in[0], in[1], name, prev)
		}
		seen[name] = in[0] + " " + in[1]
	}
}

func TestNewPodNetwork(t *testing.T) {
	for _, cidr := range []string{"", "10.42.0.0", "garbage", "10.42.0.0/33"} {
		if _, err := newPodNetwork(hostID("n1", "d"), t.TempDir(), cidr); err == nil {
			t.Errorf("newPodNetwork accepted pod CIDR %q", cidr)
		}
	}
	dir := t.TempDir()
	n, err := newPodNetwork(hostID("n1", dir), dir, "10.42.3.0/24")
	if err != nil {
		t.Fatal(err)
	}
	if n.bridge != bridgeName("n1", dir) || n.list.Name != "skiff" || n.list.CNIVersion != "1.0.0" || len(n.list.Plugins) != 2 {
		t.Fatalf("network %+v, list %+v", n, n.list)
	}
	var bridge struct {
		Type, Bridge                   string
		IsGateway, IPMasq, HairpinMode bool
		IPAM                           struct {
			Type, DataDir string
			Ranges        [][]map[string]string
		}
	}
	if err := json.Unmarshal(n.list.Plugins[0].Bytes, &bridge); err != nil {
		t.Fatal(err)
	}
	if bridge.Type != "bridge" || bridge.Bridge != n.bridge || !bridge.IsGateway || bridge.IPMasq || bridge.IPAM.Type != "host-local" ||
		bridge.IPAM.DataDir != filepath.Join(dir, "cni", "ipam") || !reflect.DeepEqual(bridge.IPAM.Ranges, [][]map[string]string{{{"subnet": "10.42.3.0/24"}}}) {
		t.Errorf("bridge plugin %s", n.list.Plugins[0].Bytes)
	}
	var portmap struct {
		Type         string
		Capabilities map[string]bool
	}
	if err := json.Unmarshal(n.list.Plugins[1].Bytes, &portmap); err != nil || portmap.Type != "portmap" || !portmap.Capabilities["portMappings"] {
		t.Errorf("portmap plugin %s (%v)", n.list.Plugins[1].Bytes, err)
	}
	if len(n.loopback.Plugins) != 1 || n.loopback.Plugins[0].Network.Type != "loopback" {
		t.Errorf("loopback list %+v", n.loopback)
	}
	if fi, err := os.Stat(filepath.Join(dir, "cni", "cache")); err != nil || !fi.IsDir() {
		t.Errorf("CNI cache dir: %v", err)
	}
}

func TestRuntimeConf(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-1"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Ports: []corev1.ContainerPort{{ContainerPort: 1, HostPort: 1}}}},
		Containers: []corev1.Container{
			{Name: "a", Ports: []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 9000},
				{ContainerPort: 53, HostPort: 5353, Protocol: corev1.ProtocolUDP, HostIP: "127.0.0.1"}}},
			{Name: "b", Ports: []corev1.ContainerPort{{ContainerPort: 132, HostPort: 1320, Protocol: corev1.ProtocolSCTP},
				{ContainerPort: 443, HostPort: 8443, Protocol: corev1.ProtocolTCP}}},
		}}}
	n := &podNetwork{}
	rt := n.runtimeConf("sb-1", "/run/netns/x", pod)
	if rt.ContainerID != "sb-1" || rt.NetNS != "/run/netns/x" || rt.IfName != "eth0" {
		t.Errorf("runtime conf %+v", rt)
	}
	wantArgs := [][2]string{{"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", "web"}, {"K8S_POD_UID", "uid-1"}, {"IgnoreUnknown", "1"}}
	if !reflect.DeepEqual(rt.Args, wantArgs) {
		t.Errorf("args %v", rt.Args)
	}
	want := map[string]any{"portMappings": []map[string]any{
		{"hostPort": int32(8080), "containerPort": int32(80), "protocol": "tcp", "hostIP": ""},
		{"hostPort": int32(5353), "containerPort": int32(53), "protocol": "udp", "hostIP": "127.0.0.1"},
		{"hostPort": int32(1320), "containerPort": int32(132), "protocol": "sctp", "hostIP": ""},
		{"hostPort": int32(8443), "containerPort": int32(443), "protocol": "tcp", "hostIP": ""},
	}}
	if !reflect.DeepEqual(rt.CapabilityArgs, want) {
		t.Errorf("capability args %v\nwant %v", rt.CapabilityArgs, want)
	}
	pod.Spec.Containers = []corev1.Container{{Name: "a", Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}
	if rt := n.runtimeConf("sb-1", "/run/netns/x", pod); rt.CapabilityArgs != nil {
		t.Errorf("capability args %v without hostPorts", rt.CapabilityArgs)
	}
}
