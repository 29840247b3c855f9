package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// netnsDir is where pinned pod network namespaces live, as `ip netns` keeps them.
const netnsDir = "/run/netns"

// netnsPath is the pinned network namespace of a pod: unique per pod, so tests and agents never collide.
func netnsPath(uid string) string { return filepath.Join(netnsDir, "skiff-"+uid) }

// sandbox is a running pod sandbox: the pause container that holds the pod's namespaces.
type sandbox struct {
	id    string
	pid   uint32
	ip    string
	netns string // empty for hostNetwork pods
	// pidNS is the PID namespace a container joins (/proc/<pid>/ns/pid); empty for a PID namespace of its own.
	// An ephemeral container with a targetContainerName gets a copy of the sandbox with its target's.
	pidNS string
}

// nsPath is the path of one of the pause process's namespaces, which the pod's containers join.
func (s *sandbox) nsPath(kind string) string { return fmt.Sprintf("/proc/%d/ns/%s", s.pid, kind) }

// policyWait bounds how long a sandbox waits for its pod's network policy chains before it is retried.
const policyWait = 15 * time.Second

// createSandbox starts a pod's pause container and network:
//  1. create and start the pause container in new network, IPC, UTS and PID namespaces (the node's for hostNetwork,
//     hostIPC and hostPID pods);
//  2. pin its network namespace under /run/netns, so that CNI DEL works even after the pause process is gone;
//  3. make sure of the node's masquerade chain (proxy/masquerade.go), then CNI ADD for the pod IP, recorded on the
//     container so an agent restart finds it;
//  4. write the pod's /etc/hosts, /etc/hostname and /etc/resolv.conf.
func (r *containerdRuntime) createSandbox(ctx context.Context, pod *corev1.Pod) (*sandbox, error) {
	pause, err := r.ensurePauseImage(ctx)
	if err != nil {
		return nil, fmt.Errorf("pause image: %w", err)
	}
	id := sandboxID(pod)
	hostname := podHostname(pod)
	opts := []oci.SpecOpts{oci.WithImageConfig(pause)}
	if pod.Spec.HostNetwork {
		// runc cannot set a hostname in the host's UTS namespace; the pod has the node's.
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostNamespace(specs.UTSNamespace))
	} else {
		opts = append(opts, oci.WithHostname(hostname))
	}
	// hostIPC and hostPID put the pause process, and so the pod's containers, in the node's IPC and PID
	// namespaces, as containerd's CRI plugin does.
	if pod.Spec.HostIPC {
		opts = append(opts, oci.WithHostNamespace(specs.IPCNamespace))
	}
	if pod.Spec.HostPID {
		opts = append(opts, oci.WithHostNamespace(specs.PIDNamespace))
	}
	// The pod's sysctls go where containerd's CRI plugin puts them: on the sandbox, whose network and IPC
	// namespaces the pod's containers join. Admission (admit.go) let only namespaced, safe ones through.
	opts = append(opts, withSysctls(podSysctls(pod)))
	labels := map[string]string{labelPodUID: string(pod.UID), labelPodName: pod.Name, labelPodNamespace: pod.Namespace, labelKind: kindSandbox}
	ctr, err := r.newContainer(ctx, id, func() (containerd.Container, error) {
		return r.client.NewContainer(ctx, id, containerd.WithNewSnapshot(id, pause), containerd.WithNewSpec(opts...),
			containerd.WithContainerLabels(labels))
	})
	if err != nil {
		return nil, fmt.Errorf("creating the sandbox container: %w", err)
	}
	sb, err := r.startSandbox(ctx, pod, ctr, hostname)
	if err != nil {
		// Undo the half-made sandbox (CNI DEL, netns, container), so that the next sync starts clean.
		rec := &ctrRecord{ctr: ctr, id: id, labels: labels}
		if cerr := r.removeSandbox(ctx, pod, rec); cerr != nil {
			r.logger.Warn("removing a half-made sandbox", "pod", pod.Namespace+"/"+pod.Name, "error", cerr)
		}
		return nil, err
	}
	return sb, nil
}

// startSandbox starts the pause task, then pins and wires its network namespace (steps 1-4 above).
func (r *containerdRuntime) startSandbox(ctx context.Context, pod *corev1.Pod, ctr containerd.Container, hostname string) (*sandbox, error) {
	id := ctr.ID()
	task, err := r.newTask(ctx, ctr, cio.NullIO)
	if err != nil {
		return nil, fmt.Errorf("creating the sandbox task: %w", err)
	}
	exited, err := task.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	if err := task.Start(ctx); err != nil {
		return nil, fmt.Errorf("starting the sandbox: %w", err)
	}
	// A sandbox that dies takes the pod's network with it: sync the pod at once to make a new one.
	go func() {
		<-exited
		r.resync(pod, 0)
	}()
	sb := &sandbox{id: id, pid: task.Pid()}
	if pod.Spec.HostNetwork {
		sb.ip = r.hostIP
	} else {
		sb.netns = netnsPath(string(pod.UID))
		if err := pinNetns(sb.nsPath("net"), sb.netns); err != nil {
			return nil, err
		}
		if _, err := ctr.SetLabels(ctx, map[string]string{labelNetns: sb.netns}); err != nil {
			return nil, err
		}
		network, err := r.podNetwork()
		if err != nil {
			return nil, err
		}
		if err := r.ensureNodeNetwork(ctx); err != nil {
			return nil, err
		}
		if sb.ip, err = network.add(ctx, id, sb.netns, pod); err != nil {
			return nil, err
		}
		// A pod a NetworkPolicy isolates starts only once its chains are in force (netpol.Engine.Wired).
		if r.policies != nil {
			if err := r.policies.Wired(ctx, pod, sb.ip, policyWait); err != nil {
				return nil, err
			}
		}
	}
	if _, err := ctr.SetLabels(ctx, map[string]string{labelIP: sb.ip}); err != nil {
		return nil, err
	}
	if err := writePodDNSFiles(r.podDir(pod), pod, sb.ip, hostname, r.clusterDNS()); err != nil {
		return nil, err
	}
	return sb, nil
}

// removeSandbox undoes createSandbox; every step tolerates what is already gone, so it is safe to repeat.
func (r *containerdRuntime) removeSandbox(ctx context.Context, pod *corev1.Pod, rec *ctrRecord) error {
	// The netns label may be missing if sandbox creation failed half-way; the path is known anyway.
	netns := rec.labels[labelNetns]
	if netns == "" && rec.labels[labelIP] != r.hostIP {
		netns = netnsPath(string(pod.UID))
	}
	if netns != "" {
		// An agent killed between creating the pin's file and mounting the namespace on it (or between
		// unmounting and removing it) leaves a plain file, which CNI plugins refuse as a namespace: DEL then
		// goes without one, which still releases the pod's IP, as the spec allows.
		cniNetns := netns
		if !isNetnsPin(netns) {
			cniNetns = ""
		}
		network, err := r.podNetwork()
		if err == nil {
			err = network.del(ctx, rec.id, cniNetns, pod)
		}
		if err != nil {
			// Keep the sandbox, and with it what DEL needs, so that the next try releases the IP.
			return err
		}
		if err := unpinNetns(netns); err != nil {
			return err
		}
		if r.policies != nil {
			r.policies.Forget(pod.UID)
		}
	}
	return r.deleteContainer(ctx, rec)
}

// pinNetns bind-mounts a namespace file onto a new file at path. A pin left there by a sandbox that is gone
// is removed first rather than mounted over.
func pinNetns(from, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := unpinNetns(path); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if f != nil {
		f.Close()
	}
	if err := unix.Mount(from, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("pinning the network namespace at %s: %w", path, err)
	}
	return nil
}

// isNetnsPin tells whether path is a namespace mounted (pinned) there, not a plain file or nothing.
func isNetnsPin(path string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(path, &fs) == nil && fs.Type == unix.NSFS_MAGIC
}

// unpinNetns unmounts and removes a pinned namespace; the namespace dies with its last user. A pin mounted
// twice (a pin retried after an agent was killed between mounting it and recording it) is unmounted twice.
func unpinNetns(path string) error {
	for range 8 {
		if !isNetnsPin(path) {
			break
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// podHostname is the pod's hostname: spec.hostname, else its name, cut to 63 bytes as the kubelet does.
func podHostname(pod *corev1.Pod) string {
	h := pod.Name
	if pod.Spec.Hostname != "" {
		h = pod.Spec.Hostname
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// writePodDNSFiles writes the files every container of the pod mounts: /etc/hosts with the pod's own name and
// hostAliases, /etc/hostname, and /etc/resolv.conf by dnsPolicy and dnsConfig (see podResolvConf). cluster
// is the cluster DNS as the agent knows it now; zero when it does not know it yet.
func writePodDNSFiles(dir string, pod *corev1.Pod, ip, hostname string, cluster clusterDNS) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var hosts strings.Builder
	if pod.Spec.HostNetwork {
		// The node's own hosts file, as the kubelet gives hostNetwork pods, with the aliases after it.
		node, _ := os.ReadFile("/etc/hosts")
		hosts.WriteString("# Kubernetes-managed hosts file (host network).\n")
		hosts.Write(node)
		if len(node) > 0 && node[len(node)-1] != '\n' {
			hosts.WriteByte('\n')
		}
	} else {
		hosts.WriteString("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
		fqdn := hostname
		if pod.Spec.Subdomain != "" {
			domain := cluster.Domain
			if domain == "" {
				domain = "cluster.local" // the servers' default, until the agent hears otherwise
			}
			fqdn = fmt.Sprintf("%s.%s.%s.svc.%s\t%s", hostname, pod.Spec.Subdomain, pod.Namespace, domain, hostname)
		}
		fmt.Fprintf(&hosts, "%s\t%s\n", ip, fqdn)
	}
	for _, alias := range pod.Spec.HostAliases {
		fmt.Fprintf(&hosts, "%s\t%s\n", alias.IP, strings.Join(alias.Hostnames, "\t"))
	}
	host, _ := os.ReadFile(hostResolvConfPath)
	resolv := podResolvConf(pod, parseResolvConf(host), cluster).String()
	for name, content := range map[string]string{"etc-hosts": hosts.String(), "etc-hostname": hostname + "\n", "etc-resolv.conf": resolv} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// podDNSFilesExist tells whether writePodDNSFiles has written every file into dir.
func podDNSFilesExist(dir string) bool {
	for _, name := range []string{"etc-hosts", "etc-hostname", "etc-resolv.conf"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

// podDNSMounts bind-mounts the files writePodDNSFiles wrote into a container.
func podDNSMounts(dir string) []specs.Mount {
	var mounts []specs.Mount
	for _, m := range [][2]string{{"etc-hosts", "/etc/hosts"}, {"etc-hostname", "/etc/hostname"}, {"etc-resolv.conf", "/etc/resolv.conf"}} {
		mounts = append(mounts, specs.Mount{Source: filepath.Join(dir, m[0]), Destination: m[1], Type: "bind", Options: []string{"rbind", "rw"}})
	}
	return mounts
}

// isGone tells whether a containerd error means the object no longer exists.
func isGone(err error) bool { return err == nil || errdefs.IsNotFound(err) }
