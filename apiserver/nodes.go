package apiserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
)

// Node pod CIDRs: each Node gets a /24 of the cluster CIDR when it is created, held by a store key created
// with the store's Create, which fails if another Node holds it; so the assignment is safe across peers and
// leader changes, as Service addresses are. It is released once the Node is really deleted (the store's AfterDelete hook). A Node that names its own
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
	cidr   *net.IPNet
	claims *raftstore.Claims // held pod CIDRs, by cidrKey, holder the Node's name
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
	if err != nil && claimed != "" && definitelyRejected(err) {
		// Given back even if the client has gone. After a timeout the Node may exist: the CIDR stays held.
		r.release(context.WithoutCancel(ctx), claimed, node.Name)
	}
	return out, err
}

// definitelyRejected reports whether a create certainly stored nothing.
func definitelyRejected(err error) bool {
	return apierrors.IsAlreadyExists(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsForbidden(err) || apierrors.IsConflict(err)
}

// releaseAfterDelete is the store's AfterDelete hook: it runs once a Node is really gone (after its
// finalizers, and for collection deletes too) and gives its pod CIDR back.
func (r *nodeREST) releaseAfterDelete(obj runtime.Object, _ *metav1.DeleteOptions) {
	if node, ok := obj.(*corev1.Node); ok && node.Spec.PodCIDR != "" {
		r.release(context.Background(), node.Spec.PodCIDR, node.Name)
	}
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
		var claimed *raftstore.ClaimedError
		created, err := r.claims.Claim(ctx, cidrKey(cidr.String()), node.Name)
		if errors.As(err, &claimed) {
			return "", apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Node").GroupKind(), node.Name,
				field.ErrorList{field.Invalid(path, want, fmt.Sprintf("is already assigned to node %q", claimed.Holder))})
		} else if err != nil {
			return "", err
		}
		node.Spec.PodCIDRs = []string{cidr.String()}
		if !created {
			// Held by this very Node (an agent registering again): the create will say AlreadyExists, and
			// the CIDR must stay held.
			return "", nil
		}
		return cidr.String(), nil
	}
	ones, _ := r.cidr.Mask.Size()
	if ones > podCIDRBits {
		return "", nil
	}
	taken := r.claims.Holders()
	base := binary.BigEndian.Uint32(r.cidr.IP.To4())
	for i := uint32(0); i < 1<<(podCIDRBits-ones); i++ {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, base+i<<(32-podCIDRBits))
		cidr := fmt.Sprintf("%s/%d", ip, podCIDRBits)
		if _, ok := taken[cidrKey(cidr)]; ok {
			continue
		}
		_, err := r.claims.Claim(ctx, cidrKey(cidr), node.Name)
		if errors.Is(err, raftstore.ErrClaimed) {
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

// release frees a CIDR if the node still holds it.
func (r *nodeREST) release(ctx context.Context, cidr, node string) {
	_ = r.claims.Release(ctx, cidrKey(cidr), node) // a CIDR left held is wasted, not shared; a retry is not worth a failed delete
}

// validateNodeUpdate keeps the pod CIDR as creation assigned it: an update cannot set, change or clear it
// (only creation claims one in the store).
func validateNodeUpdate(o, old runtime.Object) field.ErrorList {
	node, oldNode := o.(*corev1.Node), old.(*corev1.Node)
	var errs field.ErrorList
	if node.Spec.PodCIDR != oldNode.Spec.PodCIDR {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "podCIDR"), "is assigned when the Node is created and may not change"))
	}
	if !slices.Equal(node.Spec.PodCIDRs, oldNode.Spec.PodCIDRs) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "podCIDRs"), "is assigned when the Node is created and may not change"))
	}
	return errs
}
