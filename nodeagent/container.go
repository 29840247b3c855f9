package nodeagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	kubeletqos "k8s.io/kubernetes/pkg/kubelet/qos"

	"github.com/skiff-dev/skiff/nodeagent/containerio"
)

// startContainer runs one attempt of a container:
//  1. the image, per imagePullPolicy (a pull failure leaves the container waiting in ErrImagePull);
//  2. env and mounts (a missing key leaves it in CreateContainerConfigError);
//  3. create the container in the sandbox's namespaces (event Created), start it (event Started);
//  4. the postStart hook; a failure kills the container, which restarts per restartPolicy;
//  5. drop attempts older than the previous one, which the status still reports as lastState.
func (r *containerdRuntime) startContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, kind string, attempt int,
	sb *sandbox, vols podVolumes, recs *podRecords) error {
	img, err := r.ensureImage(ctx, pod, c)
	var outcome *pullOutcome
	if errors.As(err, &outcome) {
		r.setWaiting(pod.UID, c.Name, corev1.ContainerStateWaiting{Reason: outcome.reason, Message: outcome.message})
		if outcome.retryAfter > 0 {
			r.resync(pod, outcome.retryAfter)
		}
		return nil
	} else if err != nil {
		return err
	}
	configError := func(err error) error {
		r.setWaiting(pod.UID, c.Name, corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: err.Error()})
		r.event(pod, corev1.EventTypeWarning, "Failed", "Error: %v", err)
		r.resync(pod, 10*time.Second)
		return nil
	}
	withIPs := pod.DeepCopy()
	withIPs.Status.PodIP, withIPs.Status.HostIP = sb.ip, r.hostIP
	withIPs.Status.PodIPs, withIPs.Status.HostIPs = []corev1.PodIP{{IP: sb.ip}}, []corev1.HostIP{{IP: r.hostIP}}
	services, err := serviceEnv(withIPs, r.clusterDNS().ServiceCIDR, r.services)
	if err != nil {
		return configError(err)
	}
	env, err := containerEnv(ctx, withIPs, c, r.objects, r.allocatable, services)
	if err != nil {
		return configError(err)
	}
	mounts, err := containerMounts(readOnlyClaimMounts(pod, c), vols, env)
	if err != nil {
		return configError(err)
	}
	imgSpec, err := img.Spec(ctx)
	if err != nil {
		return err
	}
	id := containerID(pod, kind, c.Name, attempt)
	termination, err := r.terminationMessageMount(pod, c, id)
	if err != nil {
		return err
	}
	mounts = append(append(podDNSMounts(r.podDir(pod)), mounts...), termination...)
	opts, err := r.specOpts(pod, c, img, imgSpec.Config.Entrypoint, imgSpec.Config.Cmd, env, mounts, sb)
	if err != nil {
		return configError(err)
	}
	labels := map[string]string{
		labelPodUID: string(pod.UID), labelPodName: pod.Name, labelPodNamespace: pod.Namespace,
		labelKind: kind, labelName: c.Name, labelAttempt: strconv.Itoa(attempt),
		labelImage: c.Image, labelImageID: imageID(img), labelStopSignal: imgSpec.Config.StopSignal,
	}
	if c.Stdin && c.StdinOnce {
		labels[labelStdinOnce] = "true"
	}
	if applied, err := json.Marshal(cgroupResources(c)); err == nil {
		labels[labelResources] = string(applied)
	}
	create := func() (containerd.Container, error) {
		return r.client.NewContainer(ctx, id, containerd.WithNewSnapshot(id, img), containerd.WithNewSpec(opts...), containerd.WithContainerLabels(labels))
	}
	ctr, err := r.newContainer(ctx, id, create)
	if errdefs.IsAlreadyExists(err) {
		// A container of this very attempt is left from a start cut short (the agent killed between create and
		// start): replace it, its stdio process too, but only when it never started. A container that ran is
		// never run again.
		if old, lerr := r.client.LoadContainer(ctx, id); lerr == nil {
			if oldLabels, lerr := old.Labels(ctx); lerr == nil && oldLabels[labelStarted] == "" &&
				oldLabels[labelName] == c.Name && oldLabels[labelKind] == kind {
				_ = containerio.Stop(r.containerIODir(pod, id))
				// The killed agent's task create may still be in its shim (the daemon outlives agents), waiting
				// for the stdio just stopped; a new create would queue behind it in that same shim for good.
				r.clearLeftoverTask(id)
				if derr := r.deleteContainer(ctx, &ctrRecord{ctr: old, id: id}); derr == nil {
					ctr, err = r.newContainer(ctx, id, create)
				}
			}
		}
	}
	if err != nil {
		r.setWaiting(pod.UID, c.Name, corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: err.Error()})
		r.event(pod, corev1.EventTypeWarning, "Failed", "Error: %v", err)
		return err
	}
	r.event(pod, corev1.EventTypeNormal, "Created", "Created container: %s", c.Name)
	rec := &ctrRecord{ctr: ctr, id: id, kind: kind, name: c.Name, attempt: attempt, labels: labels}
	// The container's stdio goes to a process of its own (package containerio), which writes the CRI log and
	// keeps stdin open for attach; it outlives agent restarts as the container does.
	logPath := r.containerLogPath(pod, c.Name, attempt)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	ioDir := r.containerIODir(pod, id)
	stdio, err := containerio.Start(ioDir, containerio.Spec{LogPath: logPath, MaxSize: r.cfg.ContainerLogMaxSize,
		MaxFiles: r.cfg.ContainerLogMaxFiles, Tty: c.TTY, Stdin: c.Stdin})
	var task containerd.Task
	if err == nil {
		task, err = r.newTask(ctx, ctr, stdio)
		if err != nil {
			_ = containerio.Stop(ioDir)
		}
		if errdefs.IsAlreadyExists(err) {
			// A leftover of the agent's own crash, not the container's failure: the container never started,
			// and the next sync replaces it.
			return err
		}
	}
	var exited <-chan containerd.ExitStatus
	if err == nil {
		// Waiting before Start, so that even an exit within microseconds is seen.
		if exited, err = task.Wait(context.WithoutCancel(ctx)); err == nil {
			err = task.Start(ctx)
		}
	}
	now := time.Now()
	if _, lerr := ctr.SetLabels(ctx, map[string]string{labelStarted: now.UTC().Format(time.RFC3339Nano)}); lerr != nil && err == nil {
		err = lerr
	}
	rec.startedAt = now
	if err != nil {
		// runc could not start the process (a missing executable, say): the kubelet shows exit code 128,
		// reason StartError, and the container follows restartPolicy like any other exit.
		r.event(pod, corev1.EventTypeWarning, "Failed", "Error: failed to start container %q: %v", c.Name, err)
		if task != nil {
			_, _ = task.Delete(ctx, containerd.WithProcessKill)
		}
		_, _ = ctr.SetLabels(ctx, map[string]string{labelExitCode: "128", labelReason: "StartError", labelFinished: now.UTC().Format(time.RFC3339Nano)})
		r.crashBackoff.next(backoffKey(pod.UID, c.Name), now, now)
		r.resync(pod, 0)
		return nil
	}
	r.mu.Lock()
	r.watching[id] = true
	r.mu.Unlock()
	go func() {
		<-exited
		r.forgetWatch(id)
		r.resync(pod, 0)
	}()
	r.setWaiting(pod.UID, c.Name, corev1.ContainerStateWaiting{})
	r.event(pod, corev1.EventTypeNormal, "Started", "Started container %s", c.Name)
	if c.Lifecycle != nil && c.Lifecycle.PostStart != nil {
		if err := r.runHook(ctx, pod, c, id, c.Lifecycle.PostStart); err != nil {
			r.event(pod, corev1.EventTypeWarning, "FailedPostStartHook", "PostStartHook failed: %v", err)
			rec.running = true
			_ = r.killContainer(ctx, pod, c, rec, time.Now(), func() time.Duration { return terminationGrace(pod) }, "")
		}
	}
	for _, old := range recs.attempts[kind+"/"+c.Name] {
		if old.attempt < attempt-1 {
			if r.deleteContainer(ctx, old) == nil {
				// Its log and stdio directory go with it; the previous attempt's stay for `logs --previous`.
				logs, _ := filepath.Glob(r.containerLogPath(pod, c.Name, old.attempt) + "*") // rotated files too
				for _, f := range logs {
					_ = os.Remove(f)
				}
				_ = os.RemoveAll(r.containerIODir(pod, old.id))
				_ = os.Remove(r.terminationMessageFile(pod, old.id))
			}
		}
	}
	return nil
}

// newContainer creates a container whose snapshot has the container's ID for its key. containerd's client
// makes the snapshot before the container, so a create cut short (the agent killed, containerd gone) can
// leave the snapshot alone, and every later create of that ID would fail with "already exists": such a
// snapshot, with no container, is removed and the create tried again. A create that fails removes the
// snapshot it made. AlreadyExists comes back only when the container itself exists.
func (r *containerdRuntime) newContainer(ctx context.Context, id string, create func() (containerd.Container, error)) (containerd.Container, error) {
	ctr, err := create()
	if errdefs.IsAlreadyExists(err) && r.containerGone(ctx, id) {
		r.removeSnapshot(ctx, id)
		ctr, err = create()
	}
	if err != nil && !errdefs.IsAlreadyExists(err) && r.containerGone(ctx, id) {
		r.removeSnapshot(ctx, id)
	}
	return ctr, err
}

func (r *containerdRuntime) containerGone(ctx context.Context, id string) bool {
	_, err := r.client.LoadContainer(ctx, id)
	return errdefs.IsNotFound(err)
}

// newTask creates a container's task. A task of the same ID may be left in its shim by an agent killed
// between a task's create and its start (the shim outlives containerd's restart): it never ran, so it is
// killed and deleted, and the create tried again.
func (r *containerdRuntime) newTask(ctx context.Context, ctr containerd.Container, ioCreate cio.Creator) (containerd.Task, error) {
	task, err := r.createTask(ctx, ctr, ioCreate)
	if !taskLeftOver(err) {
		return task, err
	}
	old, terr := ctr.Task(ctx, nil)
	switch {
	case terr == nil:
		if _, derr := old.Delete(ctx, containerd.WithProcessKill); derr != nil && !errdefs.IsNotFound(derr) {
			return nil, fmt.Errorf("%w (removing the leftover task: %v)", err, derr)
		}
	case errdefs.IsNotFound(terr):
		// containerd does not know the task, yet its bundle is there: containerd itself died (with the agent)
		// in the middle of creating it.
		if rerr := r.removeOrphanTask(ctr.ID()); rerr != nil {
			return nil, fmt.Errorf("%w (removing the leftover task: %v)", err, rerr)
		}
	}
	// containerd cleans up after a shim that died on its own time: try again for a few seconds.
	for range 20 {
		if task, err = r.createTask(ctx, ctr, ioCreate); !taskLeftOver(err) {
			return task, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil, err
}

// taskCreateTimeout bounds a task's create, as the kubelet's runtime request timeout bounds its calls to
// the runtime: a create stuck in a shim is given up, and the next sync tries again.
const taskCreateTimeout = 2 * time.Minute

// createTask creates a container's task within taskCreateTimeout; one that times out has its shim killed,
// so that the next create does not queue behind it.
func (r *containerdRuntime) createTask(ctx context.Context, ctr containerd.Container, ioCreate cio.Creator) (containerd.Task, error) {
	tctx, cancel := context.WithTimeout(ctx, taskCreateTimeout)
	defer cancel()
	task, err := ctr.NewTask(tctx, ioCreate)
	if err != nil && tctx.Err() != nil && ctx.Err() == nil {
		r.logger.Warn("a task create timed out; killing its shim", "id", ctr.ID(), "after", taskCreateTimeout)
		r.clearLeftoverTask(ctr.ID())
		return nil, fmt.Errorf("creating the task of %s: timed out after %s", ctr.ID(), taskCreateTimeout)
	}
	return task, err
}

// clearLeftoverTask kills the shim serving a task that containerd does not know (a create a killed agent
// left in flight) and removes the task's runc state and bundle, when the agent runs its own containerd.
func (r *containerdRuntime) clearLeftoverTask(id string) {
	if r.daemon == nil {
		return
	}
	killShims(r.daemon.socket(), id)
	if err := r.removeOrphanTask(id); err != nil && !errors.Is(err, os.ErrNotExist) {
		r.logger.Warn("removing a leftover task", "id", id, "error", err)
	}
}

// taskLeftOver reports a task create refused because a task of the same ID, or its bundle, is left over.
// containerd 1.6 reports a bundle directory left by a create it did not finish as the shim's failed
// "mkdir <bundle>: file exists", with no error code, not as AlreadyExists.
func taskLeftOver(err error) bool {
	return errdefs.IsAlreadyExists(err) || err != nil && strings.Contains(err.Error(), "file exists")
}

// removeOrphanTask clears what a task create cut short by containerd's own death leaves behind, which the
// restarted containerd does not adopt: the task's shim, its runc container and its bundle directory. Until
// they go, every create of a task of that ID fails with "already exists". Only the agent's private containerd
// has a state directory the agent knows.
func (r *containerdRuntime) removeOrphanTask(id string) error {
	if r.daemon == nil {
		return errors.New("the task's bundle is left in containerd's state directory; restart containerd")
	}
	bundle := filepath.Join(r.daemon.bundlesDir(), id)
	if _, err := os.Stat(bundle); err != nil {
		return err
	}
	r.logger.Warn("removing a task whose create containerd did not finish", "id", id)
	killShims(r.daemon.socket(), id)
	// The runc v2 shim keeps its containers' runc state under /run/containerd/runc/<namespace>.
	_ = exec.Command("runc", "--root", filepath.Join("/run/containerd/runc", containerdNamespace), "delete", "--force", id).Run()
	_ = unix.Unmount(filepath.Join(bundle, "rootfs"), unix.MNT_DETACH)
	return os.RemoveAll(bundle)
}

// killShims kills the shims that serve the containerd at address: those of the tasks named in ids, or all of
// them when ids is empty.
func killShims(address string, ids ...string) {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		if slices.Contains(args, address) && (len(ids) == 0 || slices.ContainsFunc(ids, func(id string) bool { return slices.Contains(args, id) })) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// removeSnapshot removes a container's snapshot, which containerd's client makes before the container.
func (r *containerdRuntime) removeSnapshot(ctx context.Context, key string) {
	if err := r.client.SnapshotService(snapshotter).Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
		r.logger.Warn("removing a leftover snapshot", "key", key, "error", err)
	}
}

// imageID is the repo@digest form the kubelet reports as a container's imageID.
func imageID(img containerd.Image) string {
	name := img.Name()
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name + "@" + img.Target().Digest.String()
}

// specOpts maps a container's spec onto an OCI runtime spec: process, namespaces shared with the sandbox,
// mounts, cgroup resources and the security context.
func (r *containerdRuntime) specOpts(pod *corev1.Pod, c *corev1.Container, img containerd.Image, entrypoint, cmd, env []string,
	mounts []specs.Mount, sb *sandbox) ([]oci.SpecOpts, error) {
	args := append(append([]string{}, entrypoint...), cmd...)
	switch {
	case len(c.Command) > 0:
		args = append(expandAll(c.Command, env), expandAll(c.Args, env)...)
	case len(c.Args) > 0:
		args = append(append([]string{}, entrypoint...), expandAll(c.Args, env)...)
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("container %q has no command: the image has no entrypoint or cmd and the pod sets none", c.Name)
	}
	opts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithProcessArgs(args...), oci.WithEnv(env), withCgroupMount, oci.WithMounts(mounts)}
	if cgroupV2() && !privileged(c) {
		// As containerd's CRI plugin: on cgroup v2 the container's own cgroup is the root it sees.
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}))
	}
	if c.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(c.WorkingDir))
	}
	if c.TTY {
		opts = append(opts, oci.WithTTY)
	}
	if pod.Spec.HostNetwork {
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostNamespace(specs.UTSNamespace))
	} else {
		opts = append(opts, oci.WithHostname(podHostname(pod)),
			oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: sb.netns}),
			oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.UTSNamespace, Path: sb.nsPath("uts")}))
	}
	if pod.Spec.HostIPC {
		opts = append(opts, oci.WithHostNamespace(specs.IPCNamespace))
	} else {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.IPCNamespace, Path: sb.nsPath("ipc")}))
	}
	opts = append(opts, pidNamespace(pod, sb)...)
	opts = append(opts, resourceOpts(c)...)
	if r.memory > 0 {
		// The kubelet's OOM score adjustment by QoS class: -997 Guaranteed, 1000 BestEffort, and for Burstable
		// less the larger the container's share of the node's memory.
		adj := kubeletqos.GetContainerOOMScoreAdjust(pod, c, r.memory)
		if floor, restricted := oomScoreFloor(); restricted && adj < floor {
			adj = floor // runc could not lower it: the container would not start
		}
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Process.OOMScoreAdj = &adj
			return nil
		})
	}
	sec, err := securityOpts(pod, c)
	if err != nil {
		return nil, err
	}
	return append(opts, sec...), nil
}

func privileged(c *corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
}

// withCgroupMount mounts the container's cgroup read-only at /sys/fs/cgroup, as containerd's CRI plugin does
// for the kubelet: runc bind-mounts the container's own cgroup there (each hierarchy's, on cgroup v1), where
// programs read their limits (cpu.max, memory.max; cpu/cpu.cfs_quota_us, memory/memory.limit_in_bytes).
func withCgroupMount(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	s.Mounts = append(s.Mounts, specs.Mount{Source: "cgroup", Destination: "/sys/fs/cgroup", Type: "cgroup",
		Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}})
	return nil
}

// oomScoreFloor is the lowest OOM score adjustment a container may get when the agent lacks CAP_SYS_RESOURCE
// (a restricted sandbox, a user namespace): its own, as containerd's restrict_oom_score_adj clamps it, since
// the kernel lets no process go below its own without that capability.
var oomScoreFloor = sync.OnceValues(func() (int, bool) {
	const capSysResource = 24
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			if caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64); err == nil && caps&(1<<capSysResource) != 0 {
				return 0, false
			}
		}
	}
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0, false
	}
	floor, err := strconv.Atoi(strings.TrimSpace(string(own)))
	return floor, err == nil
})

// cgroupV2 tells whether the node's /sys/fs/cgroup is the unified (v2) hierarchy.
var cgroupV2 = sync.OnceValue(func() bool {
	var fs unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC
})

// pidNamespace is the PID namespace of a container: the node's for a hostPID pod; its target's for an
// ephemeral container that names one (ephemeral.go); the sandbox's, where the pause process is PID 1 and reaps
// orphans, for a pod that shares its process namespace; otherwise one of its own (no option: runc makes it).
func pidNamespace(pod *corev1.Pod, sb *sandbox) []oci.SpecOpts {
	switch {
	case pod.Spec.HostPID:
		return []oci.SpecOpts{oci.WithHostNamespace(specs.PIDNamespace)}
	case sb.pidNS != "":
		return []oci.SpecOpts{oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: sb.pidNS})}
	case pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace:
		return []oci.SpecOpts{oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: sb.nsPath("pid")})}
	}
	return nil
}

// cgroupResources is what resourceOpts applies of a container's resources: its cpu and memory requests and
// limits.
func cgroupResources(c *corev1.Container) corev1.ResourceRequirements {
	var out corev1.ResourceRequirements
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[name]; ok {
			if out.Requests == nil {
				out.Requests = corev1.ResourceList{}
			}
			out.Requests[name] = q.DeepCopy()
		}
		if q, ok := c.Resources.Limits[name]; ok {
			if out.Limits == nil {
				out.Limits = corev1.ResourceList{}
			}
			out.Limits[name] = q.DeepCopy()
		}
	}
	return out
}

// appliedResources is a container's status.resources: the spec's resources, with the cpu and memory values
// its cgroup has (recorded on the container at its creation and at each resize) in place of the spec's. A
// container made before the record existed reports the spec's.
func appliedResources(rec *ctrRecord, c *corev1.Container) *corev1.ResourceRequirements {
	res := c.Resources.DeepCopy()
	if applied, ok := recordedResources(rec); ok {
		res.Requests = withCPUMemoryOf(res.Requests, applied.Requests)
		res.Limits = withCPUMemoryOf(res.Limits, applied.Limits)
	}
	return res
}

// resourceOpts maps requests and limits to cgroup settings as the kubelet does: CPU shares from the request
// (1024 per CPU), a CFS quota from the limit over a 100 ms period, and the memory limit.
func resourceOpts(c *corev1.Container) []oci.SpecOpts {
	var opts []oci.SpecOpts
	if mem, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		opts = append(opts, oci.WithMemoryLimit(uint64(mem.Value())))
	}
	cpuReq, ok := c.Resources.Requests[corev1.ResourceCPU]
	if !ok {
		cpuReq, ok = c.Resources.Limits[corev1.ResourceCPU]
	}
	// The kernel's bounds for cpu.shares, which the kubelet applies too.
	const minShares, maxShares = 2, 262144
	shares := uint64(minShares)
	if ok {
		shares = min(max(uint64(cpuReq.MilliValue()*1024/1000), minShares), maxShares)
	}
	opts = append(opts, oci.WithCPUShares(shares))
	if lim, ok := c.Resources.Limits[corev1.ResourceCPU]; ok && !lim.IsZero() {
		const period = 100000
		opts = append(opts, oci.WithCPUCFS(max(lim.MilliValue()*period/1000, 1000), period))
	}
	return opts
}

// securityOpts maps the pod's and the container's securityContext (the container's wins) onto the spec.
func securityOpts(pod *corev1.Pod, c *corev1.Container) ([]oci.SpecOpts, error) {
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	csc := c.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	runAsUser, runAsGroup, runAsNonRoot := psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot
	if csc.RunAsUser != nil {
		runAsUser = csc.RunAsUser
	}
	if csc.RunAsGroup != nil {
		runAsGroup = csc.RunAsGroup
	}
	if csc.RunAsNonRoot != nil {
		runAsNonRoot = csc.RunAsNonRoot
	}
	// containerd's default spec sets no_new_privs and an open-files limit; Kubernetes sets neither by default.
	opts := []oci.SpecOpts{oci.WithNewPrivileges, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Rlimits = nil
		return nil
	}}
	if privileged(c) {
		opts = append(opts, oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices, oci.WithWriteableSysfs, oci.WithWriteableCgroupfs)
	}
	switch {
	case runAsUser != nil && runAsGroup != nil:
		opts = append(opts, oci.WithUIDGID(uint32(*runAsUser), uint32(*runAsGroup)))
	case runAsUser != nil:
		opts = append(opts, oci.WithUserID(uint32(*runAsUser)))
	case runAsGroup != nil:
		gid := uint32(*runAsGroup)
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Process.User.GID = gid
			return nil
		})
	}
	if groups := psc.SupplementalGroups; len(groups) > 0 || psc.FSGroup != nil {
		if psc.FSGroup != nil {
			groups = append(groups, *psc.FSGroup)
		}
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			for _, g := range groups {
				s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, uint32(g))
			}
			return nil
		})
	}
	if caps := csc.Capabilities; caps != nil {
		if dropAll(caps.Drop) {
			opts = append(opts, oci.WithCapabilities(nil))
		} else if len(caps.Drop) > 0 {
			opts = append(opts, oci.WithDroppedCapabilities(capNames(caps.Drop)))
		}
		switch {
		case dropAll(caps.Add):
			opts = append(opts, oci.WithAllKnownCapabilities)
		case len(caps.Add) > 0:
			opts = append(opts, oci.WithAddedCapabilities(capNames(caps.Add)))
		}
	}
	if csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation {
		opts = append(opts, oci.WithNoNewPrivileges)
	}
	if csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	if runAsNonRoot != nil && *runAsNonRoot {
		// Last, once the image's user and runAsUser are resolved to a UID.
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			if s.Process.User.UID == 0 {
				return errors.New("container has runAsNonRoot and image will run as root")
			}
			return nil
		})
	}
	return opts, nil
}

func dropAll(caps []corev1.Capability) bool {
	for _, c := range caps {
		if strings.EqualFold(string(c), "ALL") {
			return true
		}
	}
	return false
}

// capNames turns Kubernetes capability names ("NET_ADMIN") into the kernel's ("CAP_NET_ADMIN").
func capNames(caps []corev1.Capability) []string {
	out := make([]string, 0, len(caps))
	for _, c := range caps {
		name := strings.ToUpper(string(c))
		if !strings.HasPrefix(name, "CAP_") {
			name = "CAP_" + name
		}
		out = append(out, name)
	}
	return out
}

// expandAll expands $(VAR) references in command and args from the container's env, as the kubelet does:
// $$ is a literal $, and an unknown variable is left as written.
func expandAll(in []string, env []string) []string {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	lookup := func(name string) string {
		if v, ok := vars[name]; ok {
			return v
		}
		return "$(" + name + ")"
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expandVars(s, lookup)
	}
	return out
}

// killContainer stops one container: the preStop hook (bounded by the grace deadline), the image's stop
// signal, then SIGKILL at the deadline. The kubelet gives a container at least 2 s after its stop signal.
// message, when not empty, is the Killing event's message.
func (r *containerdRuntime) killContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, rec *ctrRecord, start time.Time,
	grace func() time.Duration, message ...string) error {
	task, err := rec.ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		return err
	}
	if len(message) == 0 {
		r.event(pod, corev1.EventTypeNormal, "Killing", "Stopping container %s", rec.name)
	} else if message[0] != "" {
		r.event(pod, corev1.EventTypeNormal, "Killing", "%s", message[0])
	}
	deadline := func() time.Time { return start.Add(grace()) }
	if c != nil && c.Lifecycle != nil && c.Lifecycle.PreStop != nil && time.Now().Before(deadline()) {
		hookCtx, cancel := context.WithDeadline(ctx, deadline())
		if err := r.runHook(hookCtx, pod, c, rec.id, c.Lifecycle.PreStop); err != nil {
			r.event(pod, corev1.EventTypeWarning, "FailedPreStopHook", "PreStopHook failed: %v", err)
		}
		cancel()
	}
	minimum := time.Now().Add(2 * time.Second)
	if err := task.Kill(ctx, stopSignal(rec.labels[labelStopSignal])); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	killed := false
	for {
		select {
		case st := <-exited:
			if err := st.Error(); err != nil {
				return fmt.Errorf("waiting for container %s to stop: %w", rec.name, err) // containerd went away; retry
			}
			return r.finalize(ctx, rec, task, st.ExitCode(), st.ExitTime())
		case <-tick.C:
			if !killed && time.Now().After(deadline()) && time.Now().After(minimum) {
				killed = true
				if err := task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
					return err
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// runHook runs a postStart or preStop handler: exec in the container, an HTTP GET, or a sleep.
func (r *containerdRuntime) runHook(ctx context.Context, pod *corev1.Pod, c *corev1.Container, id string, h *corev1.LifecycleHandler) error {
	switch {
	case h.Exec != nil:
		code, out, err := r.Exec(ctx, id, h.Exec.Command)
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("command '%s' exited with %d: %s", strings.Join(h.Exec.Command, " "), code, out)
		}
		return nil
	case h.HTTPGet != nil:
		timeout := int32(30)
		if d, ok := ctx.Deadline(); ok {
			timeout = int32(max(time.Until(d)/time.Second, 1))
		}
		probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: h.HTTPGet}, TimeoutSeconds: timeout}
		withIP := pod.DeepCopy()
		if withIP.Status.PodIP == "" {
			withIP.Status.PodIP = r.podIP(ctx, pod)
		}
		if ok, out := runProbe(ctx, livenessProbe, probe, withIP, c, id, r); !ok {
			return errors.New(out)
		}
		return nil
	case h.Sleep != nil:
		select {
		case <-time.After(time.Duration(h.Sleep.Seconds) * time.Second):
		case <-ctx.Done():
		}
		return nil
	case h.TCPSocket != nil:
		return nil // deprecated and never run by the kubelet
	}
	return nil
}

// podIP reads the pod IP recorded on its sandbox.
func (r *containerdRuntime) podIP(ctx context.Context, pod *corev1.Pod) string {
	ctr, err := r.client.LoadContainer(r.ctx(ctx), sandboxID(pod))
	if err != nil {
		return ""
	}
	labels, _ := ctr.Labels(r.ctx(ctx))
	return labels[labelIP]
}

// Exec runs a command in a running container and returns its exit code and (up to 10 KiB of) its output;
// probes and hooks use it. The process is killed when ctx ends.
func (r *containerdRuntime) Exec(ctx context.Context, id string, cmd []string) (int, []byte, error) {
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return -1, nil, err
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return -1, nil, err
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return -1, nil, err
	}
	proc := *spec.Process
	proc.Args, proc.Terminal = cmd, false
	out := &limitedBuffer{limit: 10 << 10}
	fifoDir := filepath.Join(r.cfg.DataDir, "fifo")
	if err := os.MkdirAll(fifoDir, 0o700); err != nil {
		return -1, nil, err
	}
	execID := fmt.Sprintf("exec-%016x", rand.Uint64())
	p, err := task.Exec(ctx, execID, &proc, cio.NewCreator(cio.WithStreams(nil, out, out), cio.WithFIFODir(fifoDir)))
	if err != nil {
		return -1, nil, err
	}
	defer func() { _, _ = p.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill) }()
	done, err := p.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return -1, nil, err
	}
	if err := p.Start(ctx); err != nil {
		return -1, nil, err
	}
	select {
	case st := <-done:
		// A background child can hold the output open forever; the output so far is enough.
		drained := make(chan struct{})
		go func() { p.IO().Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(2 * time.Second):
			p.IO().Cancel()
		}
		return int(st.ExitCode()), out.Bytes(), nil
	case <-ctx.Done():
		_ = p.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
		return -1, out.Bytes(), fmt.Errorf("command timed out: %w", ctx.Err())
	}
}

// limitedBuffer keeps the first limit bytes written to it; it is safe for the two output streams at once.
type limitedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.limit - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf.Bytes()...)
}
