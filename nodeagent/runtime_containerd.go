package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/hashicorp/go-hclog"
	"github.com/moby/sys/signal"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/nodeagent/containerio"
	"github.com/skiff-dev/skiff/nodeagent/dns"
	"github.com/skiff-dev/skiff/nodeagent/netpol"
	"github.com/skiff-dev/skiff/nodeagent/proxy"
)

// Labels on containerd containers. They are the agent's only record of what it runs: after a restart the
// agent rebuilds its view of every pod from them, so running containers are adopted, not restarted.
const (
	labelPodUID       = "io.skiff.pod.uid"
	labelPodName      = "io.skiff.pod.name"
	labelPodNamespace = "io.skiff.pod.namespace"
	labelKind         = "io.skiff.container.kind" // sandbox, init, app or ephemeral
	labelName         = "io.skiff.container.name"
	labelAttempt      = "io.skiff.container.attempt"
	labelImage        = "io.skiff.container.image"
	labelImageID      = "io.skiff.container.image-id"
	labelStopSignal   = "io.skiff.container.stop-signal"
	labelStarted      = "io.skiff.container.started"
	labelFinished     = "io.skiff.container.finished"
	labelExitCode     = "io.skiff.container.exit-code"
	labelReason       = "io.skiff.container.reason"
	labelResources    = "io.skiff.container.resources" // the cpu and memory requests and limits applied, as JSON
	labelIP           = "io.skiff.sandbox.ip"
	labelNetns        = "io.skiff.sandbox.netns"

	kindSandbox   = "sandbox"
	kindInit      = "init"
	kindApp       = "app"
	kindEphemeral = "ephemeral" // kubectl debug's containers (ephemeral.go): started once, never restarted
)

// containerdRuntime runs pods as containerd containers: a pause sandbox with a CNI network, volumes, then init
// and app containers, with probes, restarts and graceful termination, following the kubelet's kuberuntime.
type containerdRuntime struct {
	cfg     *config.Agent
	id      string // hostID: names the agent's bridge and chains on the host
	logger  hclog.Logger
	client  *containerd.Client
	daemon  *privateContainerd
	version string
	hostIP  string

	// Set by the agent once it has its API client and Node.
	objects     objectGetter
	recorder    record.EventRecorder
	resync      func(pod *corev1.Pod, after time.Duration)
	allocatable corev1.ResourceList
	memory      int64 // the node's memory capacity, in bytes: containers' OOM score adjustments are relative to it
	podCIDR     string
	dnsFacts    func() clusterDNS         // the cluster DNS for pods' resolv.conf (nil: not known)
	services    corelisters.ServiceLister // every Service, for the pods' service links (nil: none)
	policies    *netpol.Engine            // NetworkPolicy enforcement (nil: off)
	// nodeRequests sums the requests of the node's pods other than the one given, as the node admitted
	// them: what a resize must fit beside (resize.go). Nil: nothing else counts.
	nodeRequests func(except *corev1.Pod) corev1.ResourceList

	probes       *probeManager
	crashBackoff *restartBackoff
	pullBackoff  *restartBackoff

	pauseMu sync.Mutex

	// The pod egress masquerade chain (proxy/masquerade.go), under its own lock: iptables may wait for its lock.
	masqMu      sync.Mutex
	masqCIDRs   []string // every Node's pod CIDR, as setPodCIDRs last heard (nil until then)
	masqApplied bool     // this run of the agent made sure of the chain (holding masqCIDRs once they are known)

	mu       sync.Mutex
	network  *podNetwork
	watching map[string]bool                                       // container IDs with an exit watcher
	waiting  map[types.UID]map[string]corev1.ContainerStateWaiting // why a container is not running yet
	events   map[string]bool                                       // one-time events already recorded

	// terminationMessages holds each exited attempt's termination message file by container ID: it never
	// changes once the attempt exited, and statuses are built on every sync.
	terminationMessages sync.Map
}

// newContainerdRuntime connects to containerd: the configured socket, or a private daemon under the data dir.
func newContainerdRuntime(ctx context.Context, cfg *config.Agent, logger hclog.Logger) (*containerdRuntime, error) {
	r := &containerdRuntime{cfg: cfg, id: hostID(cfg.Name, cfg.DataDir), logger: logger, hostIP: cfg.AdvertiseAddr,
		crashBackoff: newRestartBackoff(10*time.Second, 300*time.Second, 10*time.Minute, time.Now),
		pullBackoff:  newRestartBackoff(10*time.Second, 300*time.Second, 0, time.Now),
		watching:     map[string]bool{}, waiting: map[types.UID]map[string]corev1.ContainerStateWaiting{}, events: map[string]bool{}}
	socket := cfg.ContainerdSocket
	if socket == "" {
		r.daemon = &privateContainerd{dir: filepath.Join(cfg.DataDir, "containerd"), logger: logger.Named("containerd")}
		if err := r.daemon.start(ctx); err != nil {
			return nil, err
		}
		socket = r.daemon.socket()
	}
	client, err := containerd.New(socket, containerd.WithDefaultNamespace(containerdNamespace))
	if err != nil {
		return nil, fmt.Errorf("connecting to containerd at %s: %w", socket, err)
	}
	r.client = client
	v, err := client.Version(ctx)
	if err != nil {
		return nil, fmt.Errorf("containerd at %s: %w", socket, err)
	}
	r.version = "containerd://" + v.Version
	if err := r.importAirGapImages(r.ctx(ctx)); err != nil {
		return nil, err
	}
	return r, nil
}

// ctx puts the agent's containerd namespace on a context.
func (r *containerdRuntime) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, containerdNamespace)
}

func (r *containerdRuntime) Version() string { return r.version }

// attach gives the runtime what it needs from the agent once the API client and the Node exist.
func (r *containerdRuntime) attach(objects objectGetter, recorder record.EventRecorder, resync func(*corev1.Pod, time.Duration), node *corev1.Node) {
	r.objects, r.recorder, r.resync = objects, recorder, resync
	r.allocatable = node.Status.Allocatable
	r.memory = node.Status.Capacity.Memory().Value()
	r.podCIDR = node.Spec.PodCIDR
	if r.cfg.PodCIDR != "" {
		r.podCIDR = r.cfg.PodCIDR
	}
	r.probes = newProbeManager(r, recorder, func(pod *corev1.Pod) { resync(pod, 0) })
	if r.podCIDR != "" {
		if err := os.WriteFile(filepath.Join(r.cfg.DataDir, podCIDRFile), []byte(r.podCIDR+"\n"), 0o600); err != nil {
			r.logger.Warn("recording the pod CIDR", "error", err)
		}
	}
}

func (r *containerdRuntime) podNetwork() (*podNetwork, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.network == nil {
		n, err := newPodNetwork(r.id, r.cfg.DataDir, r.podCIDR)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", r.cfg.Name, err)
		}
		r.network = n
	}
	return r.network, nil
}

// ensureNodeNetwork makes sure of the node's bridge, marked as this agent's (claimBridge), and of the
// masquerade chain if this run of the agent has not yet: with the bridge's ipMasq off, a new pod's egress
// depends on it. Only pod creation needs them, so deletions never wait on iptables.
func (r *containerdRuntime) ensureNodeNetwork(ctx context.Context) error {
	r.masqMu.Lock()
	defer r.masqMu.Unlock()
	if r.masqApplied {
		return nil
	}
	if err := claimBridge(ctx, bridgeOf(r.id), proxy.OwnerComment(r.id, r.cfg.DataDir)); err != nil {
		return err
	}
	return r.syncMasqueradeLocked(ctx)
}

// setPodCIDRs hands the runtime every Node's pod CIDR (sorted, non-nil); traffic to them is not masqueraded.
// The chain is rewritten when they changed, and on recheck (a minute apart), which repairs a chain or jump
// someone else removed and retries a failed write; Node heartbeats alone never run iptables.
func (r *containerdRuntime) setPodCIDRs(ctx context.Context, cidrs []string, recheck bool) {
	r.masqMu.Lock()
	defer r.masqMu.Unlock()
	if !recheck && r.masqCIDRs != nil && slices.Equal(cidrs, r.masqCIDRs) {
		return
	}
	r.masqCIDRs = cidrs
	if r.podCIDR == "" {
		return // no pods without a pod CIDR: ensureNodeNetwork writes the chain before the first
	}
	if err := r.syncMasqueradeLocked(ctx); err != nil {
		r.logger.Warn("updating the pod egress masquerade", "error", err)
	}
}

// syncMasqueradeLocked writes the node's masquerade chain; r.masqMu is held.
func (r *containerdRuntime) syncMasqueradeLocked(ctx context.Context) error {
	exempt := r.masqCIDRs
	if !slices.Contains(exempt, r.podCIDR) { // agent.pod_cidr may differ from the Node's spec
		exempt = append([]string{r.podCIDR}, exempt...)
	}
	err := proxy.SyncMasquerade(ctx, proxy.MasqueradeChain(r.id), proxy.OwnerComment(r.id, r.cfg.DataDir), r.podCIDR, exempt, r.masqCIDRs == nil)
	r.masqApplied = err == nil
	return err
}

func (r *containerdRuntime) podDir(pod *corev1.Pod) string {
	return filepath.Join(r.cfg.DataDir, "pods", string(pod.UID))
}

func sandboxID(pod *corev1.Pod) string { return string(pod.UID) + "-sandbox" }

// maxContainerIDLen is containerd's limit on a container's ID (and its snapshot's key).
const maxContainerIDLen = 76

// containerID names an attempt of a container: <pod UID>-<kind>-<name>-<attempt>, readable in `ctr` and in
// the logs. A name too long for containerd's limit (a DNS label may have 63 characters, the UID takes 36) is
// cut, and a hash of the whole name keeps it unique; the labels, not the ID, say which container it is.
func containerID(pod *corev1.Pod, kind, name string, attempt int) string {
	id := fmt.Sprintf("%s-%s-%s-%d", pod.UID, kind, name, attempt)
	if len(id) <= maxContainerIDLen {
		return id
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	suffix := fmt.Sprintf("-%08x-%d", h.Sum32(), attempt)
	prefix := fmt.Sprintf("%s-%s-", pod.UID, kind)
	cut := strings.TrimRight(name[:max(maxContainerIDLen-len(prefix)-len(suffix), 0)], "-.")
	return prefix + cut + suffix
}

func (r *containerdRuntime) event(pod *corev1.Pod, kind, reason, format string, args ...any) {
	if r.recorder != nil {
		r.recorder.Eventf(pod, kind, reason, format, args...)
	}
}

// eventOnce records an event the first time key is seen for the pod, for events the kubelet records once per
// container start rather than once per sync.
func (r *containerdRuntime) eventOnce(pod *corev1.Pod, key, kind, reason, format string, args ...any) {
	r.mu.Lock()
	k := string(pod.UID) + "/" + key
	seen := r.events[k]
	r.events[k] = true
	r.mu.Unlock()
	if !seen {
		r.event(pod, kind, reason, format, args...)
	}
}

// ctrRecord is what containerd holds of one container of a pod.
type ctrRecord struct {
	ctr        containerd.Container
	id         string
	kind, name string
	attempt    int
	labels     map[string]string
	running    bool
	pid        uint32
	exited     bool // the process ran and ended; exitCode, startedAt and finishedAt are set
	exitCode   int
	reason     string
	startedAt  time.Time
	finishedAt time.Time
}

// podRecords are a pod's containers: its sandbox, and every attempt of each container by kind/name, latest last.
type podRecords struct {
	sandbox  *ctrRecord
	attempts map[string][]*ctrRecord
	// finalized is set when loading found (and recorded) an exit no one had seen.
	finalized bool
}

func (p *podRecords) latest(kind, name string) *ctrRecord {
	a := p.attempts[kind+"/"+name]
	if len(a) == 0 {
		return nil
	}
	return a[len(a)-1]
}

// nextAttempt is the attempt number of a container's next start: 0 for the first, the latest attempt's own
// number when that one never started (its leftover is replaced), and one more than it otherwise.
func nextAttempt(last *ctrRecord) int {
	switch {
	case last == nil:
		return 0
	case !last.running && !last.exited:
		return last.attempt
	}
	return last.attempt + 1
}

func (p *podRecords) previous(kind, name string) *ctrRecord {
	a := p.attempts[kind+"/"+name]
	if len(a) < 2 {
		return nil
	}
	return a[len(a)-2]
}

// loadPod reads a pod's containers from containerd. A task that has exited is finalized here: its exit is
// recorded in labels and the task deleted, so that the record survives and the exit is counted once.
// A task found created but never started (the agent died in between) is started when startCreated is set
// (a sync), and otherwise left for the caller to kill (a pod being removed never starts).
func (r *containerdRuntime) loadPod(ctx context.Context, uid types.UID, startCreated bool) (*podRecords, error) {
	ctrs, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q==%s", labelPodUID, uid))
	if err != nil {
		return nil, err
	}
	recs := &podRecords{attempts: map[string][]*ctrRecord{}}
	for _, ctr := range ctrs {
		rec, finalized, err := r.record(ctx, ctr, startCreated)
		if err != nil {
			return nil, err
		}
		recs.finalized = recs.finalized || finalized
		if rec.kind == kindSandbox {
			recs.sandbox = rec
			continue
		}
		key := rec.kind + "/" + rec.name
		recs.attempts[key] = append(recs.attempts[key], rec)
	}
	for _, a := range recs.attempts {
		sort.Slice(a, func(i, j int) bool { return a[i].attempt < a[j].attempt })
	}
	return recs, nil
}

func (r *containerdRuntime) record(ctx context.Context, ctr containerd.Container, startCreated bool) (*ctrRecord, bool, error) {
	info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return nil, false, err
	}
	rec := &ctrRecord{ctr: ctr, id: ctr.ID(), labels: info.Labels, kind: info.Labels[labelKind], name: info.Labels[labelName]}
	rec.attempt, _ = strconv.Atoi(info.Labels[labelAttempt])
	rec.startedAt, _ = time.Parse(time.RFC3339Nano, info.Labels[labelStarted])
	if code, ok := info.Labels[labelExitCode]; ok {
		rec.exited = true
		rec.exitCode, _ = strconv.Atoi(code)
		rec.reason = info.Labels[labelReason]
		rec.finishedAt, _ = time.Parse(time.RFC3339Nano, info.Labels[labelFinished])
		return rec, false, nil
	}
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return rec, false, nil // created, never started (or its start failed)
	} else if err != nil {
		return nil, false, err
	}
	status, err := task.Status(ctx)
	if errdefs.IsNotFound(err) {
		// The shim no longer has the container ("container not created"): a delete that an agent killed
		// outright left half done in the daemon, which outlives it. Nothing runs; the task goes with the
		// container.
		return rec, false, nil
	} else if err != nil {
		return nil, false, err
	}
	if status.Status == containerd.Created && rec.kind != kindSandbox && startCreated {
		// Created but never started: the agent died between the task's create and its start. Its stdio process
		// outlived the agent, as for any container: start it now, as the kubelet starts a container it finds
		// created. (Deleting the task instead would kill runc's init, which the pod would see as an exit.)
		if err := task.Start(ctx); err != nil {
			return nil, false, fmt.Errorf("starting the created container %s: %w", rec.id, err)
		}
		now := time.Now()
		if _, err := ctr.SetLabels(ctx, map[string]string{labelStarted: now.UTC().Format(time.RFC3339Nano)}); err != nil {
			return nil, false, err
		}
		rec.startedAt, rec.running, rec.pid = now, true, task.Pid()
		return rec, false, nil
	}
	if status.Status != containerd.Stopped {
		rec.running, rec.pid = true, task.Pid()
		return rec, false, nil
	}
	if rec.kind == kindSandbox {
		rec.exited = true
		return rec, false, nil
	}
	return rec, true, r.finalize(ctx, rec, task, status.ExitStatus, status.ExitTime)
}

// finalize records an exited task's outcome in the container's labels and deletes the task.
func (r *containerdRuntime) finalize(ctx context.Context, rec *ctrRecord, task containerd.Task, code uint32, at time.Time) error {
	rec.running, rec.exited, rec.exitCode, rec.finishedAt = false, true, int(code), at
	rec.reason = "Error"
	switch {
	case oomKilled(rec.id):
		rec.reason = "OOMKilled"
	case code == 0:
		rec.reason = "Completed"
	}
	if _, err := rec.ctr.SetLabels(ctx, map[string]string{
		labelExitCode: strconv.Itoa(int(code)), labelReason: rec.reason, labelFinished: at.UTC().Format(time.RFC3339Nano),
	}); err != nil {
		return err
	}
	if _, err := task.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if rec.kind != kindSandbox {
		r.crashBackoff.next(backoffKey(types.UID(rec.labels[labelPodUID]), rec.name), rec.startedAt, at)
	}
	return nil
}

// oomKilled tells whether the kernel's OOM killer killed a process of the container's cgroup (the default
// cgroup path containerd gives a container is /<namespace>/<id>); it must be asked before the task is deleted.
func oomKilled(id string) bool {
	for _, f := range []struct{ path, key string }{
		{filepath.Join("/sys/fs/cgroup/memory", containerdNamespace, id, "memory.oom_control"), "oom_kill "},
		{filepath.Join("/sys/fs/cgroup", containerdNamespace, id, "memory.events"), "oom_kill "},
	} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			continue
		}
		for _, line := range splitLines(string(data)) {
			if len(line) > len(f.key) && line[:len(f.key)] == f.key && line[len(f.key):] != "0" {
				return true
			}
		}
	}
	return false
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// SyncPod computes what the pod needs and does it, in the kubelet's order:
//  1. read the pod's containers from containerd;
//  2. make sure the sandbox runs; a dead sandbox takes the pod's containers with it and is made anew;
//  3. set up the volumes (a missing ConfigMap or Secret leaves the pod ContainerCreating, and it retries);
//  4. start the ephemeral containers that never ran (even before the pod is initialized, as the kubelet does,
//     so that a stuck init container can be debugged);
//  5. run the init containers in order, each to success, one step per sync;
//  6. kill containers whose liveness failed, and start app containers that are not running and should be,
//     after their crash-loop backoff;
//  7. report the state, from containerd and the probes.
func (r *containerdRuntime) SyncPod(ctx context.Context, pod *corev1.Pod) (*PodState, error) {
	ctx = r.ctx(ctx)
	recs, err := r.loadPod(ctx, pod.UID, true)
	if err != nil {
		return nil, err
	}
	sb, err := r.ensureSandbox(ctx, pod, recs)
	if err != nil {
		r.event(pod, corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
		return r.state(pod, recs, nil), err
	}
	r.setWaiting(pod.UID, "", corev1.ContainerStateWaiting{})
	vols, err := setupVolumes(ctx, pod, r.podDir(pod), r.objects, r.allocatable, r)
	if err != nil {
		r.event(pod, corev1.EventTypeWarning, "FailedMount", "MountVolume.SetUp failed: %v", err)
		return r.state(pod, recs, sb), err
	}
	// A resize the node does not admit leaves the pod running with what it was given (resize.go).
	pod, resize := r.allocateResize(pod, recs)
	ephemeralErr := r.syncEphemeralContainers(ctx, pod, recs, sb, vols)
	initDone, stepErr := r.syncInitContainers(ctx, pod, recs, sb, vols)
	if initDone && stepErr == nil {
		stepErr = r.syncAppContainers(ctx, pod, recs, sb, vols)
	}
	if resize == nil && stepErr == nil {
		resize = r.actuateResizes(ctx, pod, recs, sb, vols)
	}
	stepErr = errors.Join(ephemeralErr, stepErr)
	if recs, err = r.loadPod(ctx, pod.UID, true); err != nil {
		return nil, err
	}
	if recs.finalized {
		// A container exited during this sync, after the step that would act on it: sync again.
		r.resync(pod, 0)
	}
	// The probes need the pod IP, which the informer's copy of a new pod does not have yet.
	withIP := pod.DeepCopy()
	withIP.Status.PodIP, withIP.Status.PodIPs = sb.ip, []corev1.PodIP{{IP: sb.ip}}
	r.watchExits(ctx, withIP, recs)
	state := r.state(pod, recs, sb)
	state.Resize = resize
	return state, stepErr
}

// ensureSandbox returns the pod's running sandbox, creating it (again) when needed.
func (r *containerdRuntime) ensureSandbox(ctx context.Context, pod *corev1.Pod, recs *podRecords) (*sandbox, error) {
	// A sandbox without a recorded IP was left half-made (by a failed CNI ADD, say): it is replaced.
	if s := recs.sandbox; s != nil && s.running && s.labels[labelIP] != "" {
		sb := &sandbox{id: s.id, pid: s.pid, ip: s.labels[labelIP], netns: s.labels[labelNetns]}
		// An agent killed between recording the sandbox's IP and writing the pod's /etc/hosts, /etc/hostname
		// and /etc/resolv.conf (the last step of startSandbox) left a sandbox whose containers cannot mount
		// them: write them now.
		if !podDNSFilesExist(r.podDir(pod)) {
			if err := writePodDNSFiles(r.podDir(pod), pod, sb.ip, podHostname(pod), r.clusterDNS()); err != nil {
				return nil, err
			}
		}
		return sb, nil
	}
	if recs.sandbox != nil {
		if pod.Spec.RestartPolicy == corev1.RestartPolicyNever && len(recs.attempts) > 0 {
			// The kubelet never starts a Never pod's containers again, not even in a new sandbox.
			return nil, fmt.Errorf("the sandbox of a pod with restartPolicy Never died")
		}
		r.event(pod, corev1.EventTypeNormal, "SandboxChanged", "Pod sandbox changed, it will be killed and re-created.")
		// The containers' latest attempts stay as records, so restart counts and last states carry over.
		if err := r.removeAll(ctx, pod, recs, func() time.Duration { return 0 }, true); err != nil {
			return nil, err
		}
		recs.sandbox = nil
	}
	if err := r.checkRuntimeHandler(ctx, pod); err != nil {
		return nil, err
	}
	return r.createSandbox(ctx, pod)
}

// runtimeHandlers are the RuntimeClass handlers the agent runs: containerd's runc, as containerd's CRI
// plugin names it by default.
var runtimeHandlers = []string{"runc"}

// checkRuntimeHandler refuses a pod whose RuntimeClass is gone or has a handler the agent does not run, as
// containerd's CRI plugin refuses the kubelet's sandbox ("no runtime for ... is configured"); the sync is
// retried, so the pod starts once the class is fixed.
func (r *containerdRuntime) checkRuntimeHandler(ctx context.Context, pod *corev1.Pod) error {
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName == "" {
		return nil
	}
	class, err := r.objects.RuntimeClass(ctx, *pod.Spec.RuntimeClassName)
	if err != nil {
		return fmt.Errorf("RuntimeClass %q: %w", *pod.Spec.RuntimeClassName, err)
	}
	if !slices.Contains(runtimeHandlers, class.Handler) {
		return fmt.Errorf("no runtime for %q is configured (this node runs %s)", class.Handler, strings.Join(runtimeHandlers, ", "))
	}
	return nil
}

// syncInitContainers starts or waits for the next init container; done is true once all have succeeded.
func (r *containerdRuntime) syncInitContainers(ctx context.Context, pod *corev1.Pod, recs *podRecords, sb *sandbox, vols podVolumes) (bool, error) {
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		last := recs.latest(kindInit, c.Name)
		if isSidecar(c) {
			// A sidecar (restartPolicy Always) counts as done once it runs, and restarts whenever it exits or
			// fails its liveness probe.
			if last != nil && last.running {
				failed, _ := r.probes.livenessFailed(pod.UID, c.Name, last.id)
				if !failed {
					continue
				}
				if err := r.killContainer(ctx, pod, c, last, time.Now(), func() time.Duration { return terminationGrace(pod) },
					fmt.Sprintf("Container %s failed liveness probe, will be restarted", c.Name)); err != nil {
					return false, err
				}
				return false, nil // the exit is seen by the next sync, which restarts it after its backoff
			}
			if last != nil && last.exited {
				if wait, left := r.crashBackoff.inBackoff(backoffKey(pod.UID, c.Name)); wait {
					r.backOff(pod, c, left)
					return false, nil
				}
			}
			return false, r.startContainer(ctx, pod, c, kindInit, nextAttempt(last), sb, vols, recs)
		}
		switch {
		case last != nil && last.exited && last.exitCode == 0:
			continue
		case last != nil && last.running:
			return false, nil
		case last != nil && last.exited && pod.Spec.RestartPolicy == corev1.RestartPolicyNever:
			return false, nil // the pod has failed
		case last != nil && last.exited:
			if wait, left := r.crashBackoff.inBackoff(backoffKey(pod.UID, c.Name)); wait {
				r.backOff(pod, c, left)
				return false, nil
			}
			return false, r.startContainer(ctx, pod, c, kindInit, last.attempt+1, sb, vols, recs)
		default:
			return false, r.startContainer(ctx, pod, c, kindInit, nextAttempt(last), sb, vols, recs)
		}
	}
	return true, nil
}

// syncAppContainers restarts containers whose liveness failed and starts those that should run.
func (r *containerdRuntime) syncAppContainers(ctx context.Context, pod *corev1.Pod, recs *podRecords, sb *sandbox, vols podVolumes) error {
	var errs []error
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		last := recs.latest(kindApp, c.Name)
		if last != nil && last.running {
			failed, msg := r.probes.livenessFailed(pod.UID, c.Name, last.id)
			if !failed {
				continue
			}
			r.logger.Debug("liveness failed", "pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "output", msg)
			if err := r.killContainer(ctx, pod, c, last, time.Now(), func() time.Duration { return terminationGrace(pod) },
				fmt.Sprintf("Container %s failed liveness probe, will be restarted", c.Name)); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if last != nil {
			if !shouldRestart(pod.Spec.RestartPolicy, last) {
				continue
			}
			if wait, left := r.crashBackoff.inBackoff(backoffKey(pod.UID, c.Name)); wait {
				r.backOff(pod, c, left)
				continue
			}
		}
		errs = append(errs, r.startContainer(ctx, pod, c, kindApp, nextAttempt(last), sb, vols, recs))
	}
	return errors.Join(errs...)
}

// shouldRestart applies restartPolicy to a container's latest attempt.
func shouldRestart(policy corev1.RestartPolicy, last *ctrRecord) bool {
	if !last.exited {
		return true // created but never started: start it
	}
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return last.exitCode != 0
	}
	return true
}

func terminationGrace(pod *corev1.Pod) time.Duration {
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// backOff marks a container as waiting in CrashLoopBackOff and syncs the pod again when the backoff ends.
func (r *containerdRuntime) backOff(pod *corev1.Pod, c *corev1.Container, left time.Duration) {
	msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", r.crashBackoff.delay(backoffKey(pod.UID, c.Name)), c.Name, pod.Name, pod.Namespace, pod.UID)
	r.setWaiting(pod.UID, c.Name, corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: msg})
	r.event(pod, corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", c.Name, pod.Name, pod.Namespace, pod.UID)
	r.resync(pod, left)
}

func (r *containerdRuntime) setWaiting(uid types.UID, name string, w corev1.ContainerStateWaiting) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if name == "" {
		delete(r.waiting, uid)
		return
	}
	if r.waiting[uid] == nil {
		r.waiting[uid] = map[string]corev1.ContainerStateWaiting{}
	}
	r.waiting[uid][name] = w
}

func (r *containerdRuntime) waitingFor(uid types.UID, name string) (corev1.ContainerStateWaiting, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.waiting[uid][name]
	return w, ok && w.Reason != ""
}

// watchExits makes sure every running container of the pod has a goroutine waiting for its exit, which syncs
// the pod when it comes; it tells the probe manager which containers run.
func (r *containerdRuntime) watchExits(ctx context.Context, pod *corev1.Pod, recs *podRecords) {
	running := map[string]runningContainer{}
	for _, attempts := range recs.attempts {
		last := attempts[len(attempts)-1]
		if last.running && (last.kind == kindApp || last.kind == kindInit && isSidecarName(pod, last.name)) {
			running[last.name] = runningContainer{ID: last.id, StartedAt: last.startedAt}
		}
		if !last.running {
			continue
		}
		r.mu.Lock()
		watched := r.watching[last.id]
		r.watching[last.id] = true
		r.mu.Unlock()
		if watched {
			continue
		}
		task, err := last.ctr.Task(ctx, nil)
		if err != nil {
			r.forgetWatch(last.id)
			continue
		}
		exited, err := task.Wait(context.WithoutCancel(ctx))
		if err != nil {
			r.forgetWatch(last.id)
			continue
		}
		go func(id string) {
			<-exited
			r.forgetWatch(id)
			r.resync(pod, 0)
		}(last.id)
	}
	r.probes.update(pod, running)
}

func (r *containerdRuntime) forgetWatch(id string) {
	r.mu.Lock()
	delete(r.watching, id)
	r.mu.Unlock()
}

// KillPod stops the pod's containers (preStop, then the stop signal, then SIGKILL at the grace deadline, which
// grace() may shorten while it waits), removes them and the sandbox, releases the IP, and removes the volumes.
func (r *containerdRuntime) KillPod(ctx context.Context, pod *corev1.Pod, grace func() time.Duration) error {
	ctx = r.ctx(ctx)
	recs, err := r.loadPod(ctx, pod.UID, false)
	if err != nil {
		return err
	}
	if err := r.removeAll(ctx, pod, recs, grace, false); err != nil {
		return err
	}
	if r.probes != nil {
		r.probes.removePod(pod.UID)
	}
	r.setWaiting(pod.UID, "", corev1.ContainerStateWaiting{})
	r.crashBackoff.forgetPod(pod.UID)
	r.pullBackoff.forgetPod(pod.UID)
	r.mu.Lock()
	for k := range r.events {
		if len(k) > len(pod.UID) && k[:len(pod.UID)] == string(pod.UID) {
			delete(r.events, k)
		}
	}
	r.mu.Unlock()
	if err := teardownVolumes(r.podDir(pod)); err != nil {
		return err
	}
	if err := r.removeImageVolumes(ctx, pod.UID); err != nil {
		return err
	}
	if finished(pod) {
		// As the kubelet keeps a finished pod's dead containers: `kubectl logs` of a completed Job's pod
		// works until the pod is deleted.
		return removeAllBut(r.podDir(pod), "logs")
	}
	return os.RemoveAll(r.podDir(pod))
}

// finished reports whether a pod has run to its end and is not being deleted.
func finished(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && (pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed)
}

// removeAllBut removes everything in dir except the entry named keep.
func removeAllBut(dir, keep string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.Name() != keep {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// removeAll kills every running container of the pod, then removes all of them and the sandbox. The regular
// containers (app, ephemeral, init) are killed in parallel, and only once they have stopped the sidecars
// (restartable init containers), one at a time in the reverse of their order in the spec, as the kubelet
// does (KEP-753): a regular container's preStop hook may still need a sidecar (a proxy, a log shipper).
// keepLatest keeps the record of each container's latest attempt (its task is gone), for a sandbox that is
// made again.
func (r *containerdRuntime) removeAll(ctx context.Context, pod *corev1.Pod, recs *podRecords, grace func() time.Duration, keepLatest bool) error {
	start := time.Now()
	// The specs give the preStop hooks. Non-restartable init and ephemeral containers have none (the API
	// forbids them a lifecycle), so a nil spec is right for them; the grace period and the stop signal (a
	// label) do not depend on the spec.
	specs := map[string]*corev1.Container{}
	for i := range pod.Spec.Containers {
		specs[kindApp+"/"+pod.Spec.Containers[i].Name] = &pod.Spec.Containers[i]
	}
	var sidecars []string // keys, in the reverse of the spec's order
	for i := len(pod.Spec.InitContainers) - 1; i >= 0; i-- {
		if c := &pod.Spec.InitContainers[i]; isSidecar(c) {
			specs[kindInit+"/"+c.Name] = c
			sidecars = append(sidecars, kindInit+"/"+c.Name)
		}
	}
	var mu sync.Mutex
	var errs []error
	kill := func(key string, rec *ctrRecord) {
		if err := r.killContainer(ctx, pod, specs[key], rec, start, grace); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for key, attempts := range recs.attempts {
		if slices.Contains(sidecars, key) {
			continue
		}
		for _, rec := range attempts {
			if rec.running {
				wg.Go(func() { kill(key, rec) })
			}
		}
	}
	wg.Wait()
	for _, key := range sidecars {
		for _, rec := range recs.attempts[key] {
			if rec.running {
				kill(key, rec)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for key, attempts := range recs.attempts {
		if keepLatest {
			attempts, recs.attempts[key] = attempts[:len(attempts)-1], attempts[len(attempts)-1:]
		}
		for _, rec := range attempts {
			errs = append(errs, r.deleteContainer(ctx, rec))
		}
	}
	if recs.sandbox != nil {
		errs = append(errs, r.removeSandbox(ctx, pod, recs.sandbox))
	}
	return errors.Join(errs...)
}

// deleteContainer removes a container, its task and its snapshot.
func (r *containerdRuntime) deleteContainer(ctx context.Context, rec *ctrRecord) error {
	if task, err := rec.ctr.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); !isGone(err) {
			return err
		}
	}
	if err := rec.ctr.Delete(ctx, containerd.WithSnapshotCleanup); !isGone(err) {
		return err
	}
	r.terminationMessages.Delete(rec.id)
	return nil
}

// Cleanup removes the containers of pods that keep() does not want: pods deleted while the agent was down.
func (r *containerdRuntime) Cleanup(ctx context.Context, keep func(uid types.UID) bool) error {
	ctx = r.ctx(ctx)
	ctrs, err := r.client.Containers(ctx)
	if err != nil {
		return err
	}
	orphans := map[types.UID]*corev1.Pod{}
	for _, ctr := range ctrs {
		labels, err := ctr.Labels(ctx)
		if err != nil {
			continue
		}
		uid := types.UID(labels[labelPodUID])
		if uid == "" || keep(uid) {
			continue
		}
		orphans[uid] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid, Name: labels[labelPodName], Namespace: labels[labelPodNamespace]}}
	}
	// In parallel, sixteen at a time: each kill waits at least two seconds for its processes to stop.
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, pod := range orphans {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r.logger.Info("removing the containers of a pod that no longer exists", "pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID)
			if err := r.KillPod(ctx, pod, func() time.Duration { return 0 }); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// What finished pods deleted while the agent was down kept: their logs.
	dirs, err := os.ReadDir(filepath.Join(r.cfg.DataDir, "pods"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, d := range dirs {
		if uid := types.UID(d.Name()); !keep(uid) {
			dir := r.podDir(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}})
			if err := teardownVolumes(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, r.removeImageVolumes(ctx, uid), os.RemoveAll(dir))
		}
	}
	return errors.Join(errs...)
}

// Close disconnects from containerd; a private daemon stops with the agent's context.
func (r *containerdRuntime) Close() {
	if r.probes != nil {
		r.probes.stop()
	}
	if r.client != nil {
		r.client.Close()
	}
}

// state reports the pod as containerd and the probes see it.
func (r *containerdRuntime) state(pod *corev1.Pod, recs *podRecords, sb *sandbox) *PodState {
	state := &PodState{SandboxReady: sb != nil}
	if sb != nil {
		state.IP = sb.ip
	}
	if recs.sandbox != nil {
		if info, err := recs.sandbox.ctr.Info(context.Background(), containerd.WithoutRefreshedMetadata); err == nil {
			state.Started = info.CreatedAt
		}
	}
	if state.Started.IsZero() {
		state.Started = time.Now()
	}
	initDone := true
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		s := r.containerStatus(pod, c, kindInit, recs, "PodInitializing")
		if !initContainerDone(c, s) {
			initDone = false
		}
		state.InitContainers = append(state.InitContainers, s)
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		reason := "ContainerCreating"
		if !initDone {
			reason = "PodInitializing"
		}
		state.Containers = append(state.Containers, r.containerStatus(pod, c, kindApp, recs, reason))
	}
	state.EphemeralContainers = r.ephemeralStatuses(pod, recs)
	return state
}

// containerStatus builds one container's status from its latest two attempts.
func (r *containerdRuntime) containerStatus(pod *corev1.Pod, c *corev1.Container, kind string, recs *podRecords, waitingReason string) corev1.ContainerStatus {
	s := corev1.ContainerStatus{Name: c.Name, Image: c.Image}
	started := false
	s.Started = &started
	last := recs.latest(kind, c.Name)
	terminated := func(rec *ctrRecord) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: int32(rec.exitCode), Reason: rec.reason,
			Message:   r.terminationMessage(pod, c, rec),
			StartedAt: metav1.NewTime(rec.startedAt), FinishedAt: metav1.NewTime(rec.finishedAt), ContainerID: "containerd://" + rec.id}
	}
	if last == nil || (!last.running && !last.exited) {
		w := corev1.ContainerStateWaiting{Reason: waitingReason}
		if ww, ok := r.waitingFor(pod.UID, c.Name); ok {
			w = ww
		}
		s.State.Waiting = &w
		if last != nil {
			s.RestartCount = int32(last.attempt)
			if prev := recs.previous(kind, c.Name); prev != nil && prev.exited {
				s.LastTerminationState.Terminated = terminated(prev)
			}
		}
		return s
	}
	s.RestartCount = int32(last.attempt)
	s.ContainerID = "containerd://" + last.id
	s.ImageID = last.labels[labelImageID]
	// As the kubelet: resources are those the container's cgroup was given, allocatedResources the spec's
	// requests.
	s.Resources = appliedResources(last, c)
	s.AllocatedResources = c.Resources.Requests.DeepCopy()
	if prev := recs.previous(kind, c.Name); prev != nil && prev.exited {
		s.LastTerminationState.Terminated = terminated(prev)
	}
	switch {
	case last.running:
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(last.startedAt)}
		if (kind == kindApp || isSidecar(c)) && r.probes != nil {
			started = r.probes.started(pod.UID, c.Name, last.id)
			s.Ready = started && r.probes.ready(pod.UID, c.Name, last.id)
		} else {
			started = true
		}
	case kind != kindEphemeral && (isSidecar(c) || ((kind == kindApp || last.exitCode != 0) && shouldRestart(pod.Spec.RestartPolicy, last))):
		// Exited and due for a restart: waiting, with the exit as the last state.
		w := corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}
		if ww, ok := r.waitingFor(pod.UID, c.Name); ok {
			w = ww
		}
		s.State.Waiting = &w
		s.LastTerminationState.Terminated = terminated(last)
	default:
		s.State.Terminated = terminated(last)
		// As the kubelet's prober manager: an init container that succeeded is ready.
		s.Ready = kind == kindInit && last.exitCode == 0
	}
	return s
}

// stopSignal parses an image's STOPSIGNAL as containerd does ("SIGQUIT", "quit", "3", "SIGRTMIN+3");
// SIGTERM when it has none or it cannot be parsed.
func stopSignal(name string) syscall.Signal {
	if sig, err := signal.ParseSignal(name); err == nil && sig > 0 {
		return sig
	}
	return syscall.SIGTERM
}

// podCIDRFile remembers the node's pod CIDR under the data dir, for Teardown, which runs without the API.
const podCIDRFile = "pod-cidr"

// Teardown removes everything an agent with this configuration runs on the host: every pod's containers,
// sandbox, network namespace, IP and volumes, then the node's bridge and iptables chains. It uses the
// agent's containerd (a private one is started for the purpose and stopped after). `skiff agent -teardown`
// runs it to decommission a node; tests run it so that a failed test leaves nothing behind.
func Teardown(ctx context.Context, cfg *config.Agent, logger hclog.Logger) error {
	return teardown(ctx, cfg, hostID(cfg.Name, cfg.DataDir), logger)
}

// teardown is Teardown of the agent with this hostID: another agent removing a dead one's pods knows its id
// and data dir, not its node name (removeDeadAgents).
func teardown(ctx context.Context, cfg *config.Agent, id string, logger hclog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, err := newContainerdRuntime(ctx, cfg, logger)
	if err != nil {
		return err
	}
	r.id = id
	defer func() {
		r.Close()
		cancel() // before the stop, so the daemon's supervisor does not restart it
		if r.daemon != nil {
			r.daemon.stop()
		}
	}()
	if cidr, err := os.ReadFile(filepath.Join(cfg.DataDir, podCIDRFile)); err == nil {
		r.podCIDR = strings.TrimSpace(string(cidr))
	}
	errs := []error{r.Cleanup(ctx, func(types.UID) bool { return false })}
	// Stdio processes of containers that never started (an agent killed in between) wait for a shim that never
	// comes.
	containerio.StopAllUnder(cfg.DataDir)
	// Tasks whose create containerd never finished (it died with a killed agent): containerd does not know
	// them, so Cleanup cannot; their shims would outlive the node.
	if r.daemon != nil {
		if bundles, err := os.ReadDir(r.daemon.bundlesDir()); err == nil {
			for _, b := range bundles {
				errs = append(errs, r.removeOrphanTask(b.Name()))
			}
		}
		// A shim whose bundle is gone (a delete left half done by an agent killed outright) would outlive
		// the node: every shim of this daemon goes.
		killShims(r.daemon.socket())
	}
	errs = append(errs, removeBridge(ctx, bridgeOf(id)))
	// The node's DNS process, which outlives agent restarts.
	errs = append(errs, dns.StopChild(dnsDir(cfg)))
	// The masquerade chain and any service chains a killed agent left.
	errs = append(errs, proxy.RemoveAll(ctx, proxy.Commands{}, id)) // network policy chains too
	errs = append(errs, netpol.RemoveSets(ctx, netpol.Commands{}, func(owner string) bool { return owner == id }))
	// Mounts a killed containerd left behind under the data dir (its temporary unpack mounts, say).
	errs = append(errs, unmountUnder(cfg.DataDir))
	// The parent cgroups runc made for the containers' /skiff/<id> paths; rmdir removes only empty ones, so
	// another agent's containers on this host are safe.
	parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", containerdNamespace))
	for _, dir := range append(parents, filepath.Join("/sys/fs/cgroup", containerdNamespace)) {
		_ = unix.Rmdir(dir)
	}
	return errors.Join(errs...)
}

// unmountUnder lazily unmounts every mount point under dir, deepest first, and the temporary mounts
// (/tmp/containerd-mount*) of a killed containerd whose layers are under dir.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	dir = filepath.Clean(dir) + "/"
	tempMounts := filepath.Join(os.TempDir(), "containerd-mount")
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && (strings.HasPrefix(fields[4]+"/", dir) || strings.HasPrefix(fields[4], tempMounts) && strings.Contains(line, dir)) {
			points = append(points, fields[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
