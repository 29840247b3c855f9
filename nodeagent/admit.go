package nodeagent

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	corev1 "k8s.io/api/core/v1"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
)

// The node's admission, as the kubelet's admit handlers: a pod the agent has not started yet is checked
// before anything of it runs, and a pod that fails a check is rejected: Failed, with the handler's reason and
// "Pod was rejected: <message>", a Warning event, and nothing started. A pod already admitted (it has a start
// time, or this agent runs it) is not checked again.

// admissionResult is a refusal; the zero value admits.
type admissionResult struct {
	reason, message string
}

// safeSysctls are the kubelet's safe sysctls (k8s.io/kubernetes/pkg/kubelet/sysctl): namespaced in the pod's
// network or IPC namespace, and without effect on other pods. The kubelet drops the newer ones on kernels
// older than their namespacing (4.5 to 4.15); the agent's supported kernels all have them.
var safeSysctls = []string{
	"kernel.shm_rmid_forced",
	"net.ipv4.ip_local_port_range",
	"net.ipv4.tcp_syncookies",
	"net.ipv4.ping_group_range",
	"net.ipv4.ip_unprivileged_port_start",
	"net.ipv4.ip_local_reserved_ports",
	"net.ipv4.tcp_keepalive_time",
	"net.ipv4.tcp_fin_timeout",
	"net.ipv4.tcp_keepalive_intvl",
	"net.ipv4.tcp_keepalive_probes",
	"net.ipv4.tcp_rmem",
	"net.ipv4.tcp_wmem",
	"net.ipv4.tcp_slow_start_after_idle",
	"net.ipv4.tcp_notsent_lowat",
}

// admitSysctls is the kubelet's sysctl admission with its default allowlist (the safe sysctls; the agent
// has no --allowed-unsafe-sysctls): reason SysctlForbidden for any other sysctl, and for a network sysctl
// of a hostNetwork pod or an IPC sysctl of a hostIPC pod.
func admitSysctls(pod *corev1.Pod) admissionResult {
	if pod.Spec.SecurityContext == nil {
		return admissionResult{}
	}
	for _, s := range pod.Spec.SecurityContext.Sysctls {
		name := utilsysctl.NormalizeName(s.Name)
		safe := false
		for _, n := range safeSysctls {
			safe = safe || n == name
		}
		if !safe {
			return admissionResult{"SysctlForbidden", fmt.Sprintf("forbidden sysctl: %q not allowlisted", name)}
		}
		ns, _, _ := utilsysctl.GetNamespace(name)
		if (ns == utilsysctl.NetNamespace && pod.Spec.HostNetwork) || (ns == utilsysctl.IPCNamespace && pod.Spec.HostIPC) {
			return admissionResult{"SysctlForbidden", fmt.Sprintf("forbidden sysctl: %q not allowed with host %s enabled", name, ns)}
		}
	}
	return admissionResult{}
}

// podSysctls are the pod's sysctls for its sandbox's spec, by their dotted names.
func podSysctls(pod *corev1.Pod) map[string]string {
	if pod.Spec.SecurityContext == nil || len(pod.Spec.SecurityContext.Sysctls) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, s := range pod.Spec.SecurityContext.Sysctls {
		out[utilsysctl.NormalizeName(s.Name)] = s.Value
	}
	return out
}

// withSysctls sets sysctls in an OCI spec (runc writes them in the container's namespaces as it starts).
func withSysctls(sysctls map[string]string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if len(sysctls) == 0 {
			return nil
		}
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		for k, v := range sysctls {
			s.Linux.Sysctl[k] = v
		}
		return nil
	}
}

// hostPortKey is one host port a pod asks for; an empty or 0.0.0.0 IP means every address of the node.
type hostPortKey struct {
	ip       string
	protocol corev1.Protocol
	port     int32
}

func hostPorts(pod *corev1.Pod) []hostPortKey {
	var out []hostPortKey
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			for _, p := range c.Ports {
				if p.HostPort <= 0 {
					continue
				}
				k := hostPortKey{ip: p.HostIP, protocol: p.Protocol, port: p.HostPort}
				if k.ip == "" {
					k.ip = "0.0.0.0"
				}
				if k.protocol == "" {
					k.protocol = corev1.ProtocolTCP
				}
				out = append(out, k)
			}
		}
	}
	return out
}

// hostPortsConflict is the scheduler's NodePorts rule: the same port and protocol conflict when either IP is
// 0.0.0.0 or both are the same.
func hostPortsConflict(a, b hostPortKey) bool {
	return a.port == b.port && a.protocol == b.protocol && (a.ip == b.ip || a.ip == "0.0.0.0" || b.ip == "0.0.0.0")
}

// admitHostPorts is the kubelet's NodePorts admission: a pod bound by nodeName past the scheduler, whose host
// port another admitted pod of the node holds, is rejected with the kubelet's reason and message.
func admitHostPorts(pod *corev1.Pod, admitted []*corev1.Pod) admissionResult {
	want := hostPorts(pod)
	if len(want) == 0 {
		return admissionResult{}
	}
	for _, other := range admitted {
		for _, held := range hostPorts(other) {
			for _, w := range want {
				if hostPortsConflict(w, held) {
					return admissionResult{"NodePorts", "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"}
				}
			}
		}
	}
	return admissionResult{}
}

// activeDeadlineExceeded is the kubelet's active deadline rule: a pod with activeDeadlineSeconds that has
// been active on the node (since status.startTime) that long is failed with DeadlineExceeded. left is the
// time until the deadline when it is not past yet (0 without a deadline or a start time).
func activeDeadlineExceeded(pod *corev1.Pod, now time.Time) (exceeded bool, left time.Duration) {
	if pod.Spec.ActiveDeadlineSeconds == nil || pod.Status.StartTime == nil || pod.Status.StartTime.IsZero() {
		return false, 0
	}
	left = pod.Status.StartTime.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second).Sub(now)
	return left <= 0, left
}

const (
	deadlineReason  = "DeadlineExceeded"
	deadlineMessage = "Pod was active on the node longer than the specified deadline"
)

// terminatedUnknown is the state the kubelet reports for a container of a terminal pod that no longer runs
// anywhere: what the agent reports of the containers it killed at the pod's deadline.
func terminatedUnknown(statuses []corev1.ContainerStatus) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, len(statuses))
	for i, s := range statuses {
		s = *s.DeepCopy()
		if s.State.Running != nil {
			s.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown",
				Message: "The container could not be located when the pod was terminated"}}
			s.Ready = false
			started := false
			s.Started = &started
		}
		out[i] = s
	}
	return out
}
