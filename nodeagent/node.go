package nodeagent

import (
	"bufio"
	"context"
	"fmt"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// nodeSpec is what the agent owns of one Node: the labels and taints it sets, and the whole status.
// Labels, taints and spec.unschedulable that others set (kubectl label, taint, cordon) are kept.
type nodeSpec struct {
	name    string
	podCIDR string // the agent's pod_cidr, or "" for one the control plane assigns
	labels  map[string]string
	taints  []corev1.Taint
	status  corev1.NodeStatus
}

// hostFacts reads the machine's capacity and identity.
type hostFacts struct {
	cpu, memory, ephemeral resource.Quantity
	kernel, osImage        string
}

func readHost(dataDir string) (hostFacts, error) {
	h := hostFacts{cpu: *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)}
	mem, err := memTotal()
	if err != nil {
		return h, err
	}
	h.memory = *resource.NewQuantity(mem, resource.BinarySI)
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dataDir, &fs); err != nil {
		return h, fmt.Errorf("statfs %s: %w", dataDir, err)
	}
	h.ephemeral = *resource.NewQuantity(int64(fs.Blocks)*fs.Bsize, resource.BinarySI)
	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err == nil {
		h.kernel = utsString(uts.Release[:])
	}
	h.osImage = osPrettyName()
	return h, nil
}

func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kib int64
		if n, _ := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kib); n == 1 {
			return kib * 1024, nil
		}
	}
	return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
}

func utsString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

func osPrettyName() string {
	data, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return runtime.GOOS
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return runtime.GOOS
}

// registerNode creates the Node, or brings an existing one in line with what the agent owns.
func registerNode(ctx context.Context, client kubernetes.Interface, want nodeSpec) (*corev1.Node, error) {
	nodes := client.CoreV1().Nodes()
	created, err := nodes.Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: want.name, Labels: want.labels},
		Spec:       corev1.NodeSpec{Taints: want.taints, PodCIDR: want.podCIDR},
		Status:     want.status,
	}, metav1.CreateOptions{})
	if err == nil || !apierrors.IsAlreadyExists(err) {
		return created, err
	}
	var node *corev1.Node
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := nodes.Get(ctx, want.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		changed := current.DeepCopy()
		if changed.Labels == nil {
			changed.Labels = map[string]string{}
		}
		for k, v := range want.labels {
			changed.Labels[k] = v
		}
		for _, t := range want.taints {
			if !hasTaint(changed.Spec.Taints, t) {
				changed.Spec.Taints = append(changed.Spec.Taints, t)
			}
		}
		if node, err = nodes.Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
			return err
		}
		// Ready belongs to the leader once the Node exists: it judges it by gossip (or the Lease). An agent
		// coming back must not claim Ready before the leader has seen its member alive again.
		status := *want.status.DeepCopy()
		for i, c := range status.Conditions {
			if c.Type != corev1.NodeReady {
				continue
			}
			for _, have := range node.Status.Conditions {
				if have.Type == corev1.NodeReady {
					status.Conditions[i] = have
				}
			}
		}
		node.Status = status
		node, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	return node, err
}

func hasTaint(taints []corev1.Taint, t corev1.Taint) bool {
	for _, have := range taints {
		if have.Key == t.Key && have.Effect == t.Effect {
			return true
		}
	}
	return false
}

// maxNodeImages is how many images a Node reports, largest first, as the kubelet's nodeStatusMaxImages.
const maxNodeImages = 50

// imageLister is a runtime that can list its images for the Node's status.images.
type imageLister interface {
	Images(ctx context.Context) ([]corev1.ContainerImage, error)
}

// reportImages keeps the Node's status.images current: it writes only when the list changed, checked every
// interval, so that an idle node costs the servers nothing.
func (a *Agent) reportImages(ctx context.Context, lister imageLister, interval time.Duration) {
	var last []corev1.ContainerImage
	for {
		if imgs, err := lister.Images(ctx); err == nil && !apiequality.Semantic.DeepEqual(imgs, last) {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				node, err := a.client.CoreV1().Nodes().Get(ctx, a.cfg.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				node.Status.Images = imgs
				_, err = a.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
				return err
			})
			if err == nil {
				last = imgs
			} else if ctx.Err() == nil {
				a.logger.Warn("reporting the node's images", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
