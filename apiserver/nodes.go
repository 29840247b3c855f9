package apiserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
	"github.com/skiff-dev/skiff/fsm"
)

// Node pod CIDRs: each Node gets a /24 of the cluster CIDR when it is created, held by a store key created
// with the store's Create, which fails if another Node holds it; so the assignment is safe across peers and
// leader changes, as Service addresses are. It is released when the Node is deleted. A Node that names its own
// spec.podCIDR (an agent's pod_cidr) claims that one. When the cluster CIDR is full the Node is created without
// one, as Kubernetes' node IPAM leaves it.

const (
	// DefaultClusterCIDR is where pod CIDRs come from unless cluster_cidr says otherwise.
	DefaultClusterCIDR = "10.244.0.0/16"
	podCIDRPrefix      = storagePrefix + "/skiff/podcidrs/"
	podCIDRBits        = 24
)

type nodeREST struct {
	*resource
	cidr    *net.IPNet
	backend raftstore.Backend
}

func (r *nodeREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	node := obj.(*corev1.Node)
	if options != nil && len(options.DryRun) > 0 {
		return r.resource.Create(ctx, obj, createValidation, options)
	}
	claimed, err := r.assign(ctx, node)
	if err != nil {
		return nil, err
	}
	out, err := r.resource.Create(ctx, obj, createValidation, options)
	if err != nil && claimed != "" {
		r.release(ctx, claimed, node.Name)
	}
	return out, err
}

func (r *nodeREST) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions) (runtime.Object, bool, error) {
	existing, err := r.resource.Get(ctx, name, &metav1.GetOptions{})
	if err != nil {
		return nil, false, err
	}
	out, immediate, err := r.resource.Delete(ctx, name, deleteValidation, options)
	if err == nil && (options == nil || len(options.DryRun) == 0) {
		if cidr := existing.(*corev1.Node).Spec.PodCIDR; cidr != "" {
			r.release(ctx, cidr, name)
		}
	}
	return out, immediate, err
}

// assign claims the Node's own spec.podCIDR, or the first free /24, and records it on the Node.
func (r *nodeREST) assign(ctx context.Context, node *corev1.Node) (string, error) {
	if want := node.Spec.PodCIDR; want != "" {
		ip, cidr, err := net.ParseCIDR(want)
		path := field.NewPath("spec", "podCIDR")
		if err != nil || ip.To4() == nil || !cidr.IP.Equal(ip) {
			return "", apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Node").GroupKind(), node.Name,
				field.ErrorList{field.Invalid(path, want, "must be an IPv4 network address with a prefix, such as 10.244.1.0/24")})
		}
		if err := r.claim(ctx, cidr.String(), node.Name); errors.Is(err, fsm.ErrAlreadyExists) {
			holder := ""
			if kv, _, err := r.backend.Store().Get(podCIDRPrefix + cidrKey(cidr.String())); err == nil {
				holder = string(kv.Value)
			}
			return "", apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Node").GroupKind(), node.Name,
				field.ErrorList{field.Invalid(path, want, fmt.Sprintf("is already assigned to node %q", holder))})
		} else if err != nil {
			return "", err
		}
		node.Spec.PodCIDRs = []string{cidr.String()}
		return cidr.String(), nil
	}
	ones, _ := r.cidr.Mask.Size()
	if ones > podCIDRBits {
		return "", nil
	}
	taken := map[string]bool{}
	for _, kv := range r.backend.Store().Range(podCIDRPrefix, "", 0).KVs {
		taken[kv.Key[len(podCIDRPrefix):]] = true
	}
	base := binary.BigEndian.Uint32(r.cidr.IP.To4())
	for i := uint32(0); i < 1<<(podCIDRBits-ones); i++ {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, base+i<<(32-podCIDRBits))
		cidr := fmt.Sprintf("%s/%d", ip, podCIDRBits)
		if taken[cidrKey(cidr)] {
			continue
		}
		err := r.claim(ctx, cidr, node.Name)
		if errors.Is(err, fsm.ErrAlreadyExists) {
			continue // another peer took it a moment ago
		}
		if err != nil {
			return "", err
		}
		node.Spec.PodCIDR, node.Spec.PodCIDRs = cidr, []string{cidr}
		return cidr, nil
	}
	return "", nil // the cluster CIDR is full
}

// cidrKey is a CIDR as a key segment: "10.244.3.0/24" is kept as "10.244.3.0-24".
func cidrKey(cidr string) string { return strings.Replace(cidr, "/", "-", 1) }

func (r *nodeREST) claim(ctx context.Context, cidr, node string) error {
	res, err := r.backend.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: podCIDRPrefix + cidrKey(cidr), Value: []byte(node)})
	if err != nil {
		return err
	}
	return res.Err()
}

// release frees a CIDR if the node still holds it.
func (r *nodeREST) release(ctx context.Context, cidr, node string) {
	key := podCIDRPrefix + cidrKey(cidr)
	if kv, _, err := r.backend.Store().Get(key); err == nil && string(kv.Value) == node {
		r.backend.Apply(ctx, &fsm.Command{Type: fsm.CmdDelete, Key: key})
	}
}

// validateNodeUpdate keeps the pod CIDR: once set it cannot change, as in Kubernetes.
func validateNodeUpdate(o, old runtime.Object) field.ErrorList {
	node, oldNode := o.(*corev1.Node), old.(*corev1.Node)
	if oldNode.Spec.PodCIDR != "" && node.Spec.PodCIDR != oldNode.Spec.PodCIDR {
		return field.ErrorList{field.Forbidden(field.NewPath("spec", "podCIDR"), "may not change once set")}
	}
	return nil
}
