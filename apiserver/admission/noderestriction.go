package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	corev1listers "k8s.io/client-go/listers/core/v1"
	kubeletapis "k8s.io/kubelet/pkg/apis"
	"k8s.io/kubernetes/pkg/auth/nodeidentifier"
)

// nodeRestriction is Kubernetes' NodeRestriction admission, written again on v1 objects (the library's
// casts to kube's internal types): a node, which the Node authorizer lets write Nodes, pods' status, leases and
// tokens, may write only its own, may not change its taints, owners or the labels reserved to
// administrators (node-restriction.kubernetes.io/ and unknown kubernetes.io/, k8s.io/ labels), and may not
// create pods (Skiff runs no static pods, so there are no mirror pods). As the local-path provisioner of its
// node, a node may create and delete only PersistentVolumes pinned to itself by node affinity; its DRA
// drivers may create and delete only the ResourceSlices of its node. It may create PodCertificateRequests
// only for a pod bound to it, naming the pod, its service account and the node by name and UID as they are,
// and a signer one of the pod's podCertificate volumes names (or that RBAC lets the node request for).
type nodeRestriction struct {
	*admission.Handler
	identifier nodeidentifier.NodeIdentifier
	pods       corev1listers.PodLister
	volumes    corev1listers.PersistentVolumeLister
	// podCertificates checks a node's PodCertificateRequests; nil refuses them all.
	podCertificates *podCertificateRestriction
}

// podCertificateRestriction is what NodeRestriction reads to check a node's PodCertificateRequest.
type podCertificateRestriction struct {
	nodes           corev1listers.NodeLister
	serviceAccounts corev1listers.ServiceAccountLister
	authz           authorizer.Authorizer
}

var _ admission.ValidationInterface = &nodeRestriction{}

func newNodeRestriction(pods corev1listers.PodLister, volumes corev1listers.PersistentVolumeLister) *nodeRestriction {
	return &nodeRestriction{
		Handler:    admission.NewHandler(admission.Create, admission.Update, admission.Delete, admission.Connect),
		identifier: nodeidentifier.NewDefaultNodeIdentifier(),
		pods:       pods,
		volumes:    volumes,
	}
}

var (
	podsResource   = corev1.Resource("pods")
	nodesResource  = corev1.Resource("nodes")
	pvcsResource   = corev1.Resource("persistentvolumeclaims")
	pvsResource    = corev1.Resource("persistentvolumes")
	saResource     = corev1.Resource("serviceaccounts")
	leasesResource = schema.GroupResource{Group: coordinationv1.GroupName, Resource: "leases"}

	endpointSlicesResource = schema.GroupResource{Group: discoveryv1.GroupName, Resource: "endpointslices"}
	resourceSlicesResource = resourcev1.Resource("resourceslices")
	pcrsResource           = certificatesv1.Resource("podcertificaterequests")
)

func (p *nodeRestriction) Validate(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	nodeName, isNode := p.identifier.NodeIdentity(a.GetUserInfo())
	if !isNode {
		return nil
	}
	if nodeName == "" {
		return admission.NewForbidden(a, fmt.Errorf("could not determine node from user %q", a.GetUserInfo().GetName()))
	}
	switch a.GetResource().GroupResource() {
	case podsResource:
		switch a.GetSubresource() {
		case "":
			return p.admitPod(nodeName, a)
		case "status":
			return p.admitPodStatus(nodeName, a)
		case "eviction":
			return p.admitPodEviction(nodeName, a)
		default:
			return admission.NewForbidden(a, fmt.Errorf("unexpected pod subresource %q, only 'status' and 'eviction' are allowed", a.GetSubresource()))
		}
	case nodesResource:
		return p.admitNode(nodeName, a)
	case pvcsResource:
		if a.GetSubresource() != "status" {
			return admission.NewForbidden(a, fmt.Errorf("may only update PVC status"))
		}
		return nil
	case pvsResource:
		return p.admitVolume(nodeName, a)
	case saResource:
		return p.admitServiceAccountToken(nodeName, a)
	case leasesResource:
		return admitNodeLease(nodeName, a)
	case endpointSlicesResource:
		return admitNodeDNSSlice(nodeName, a)
	case resourceSlicesResource:
		return admitResourceSlice(nodeName, a)
	case pcrsResource:
		return p.admitPodCertificateRequest(ctx, nodeName, a)
	}
	return nil
}

// admitPodCertificateRequest lets a node create a PodCertificateRequest only for a pod bound to it, as
// Kubernetes' NodeRestriction does: the node, pod and service account it names must be those that exist, by
// name and UID, and the pod must mount a podCertificate volume for the signer, unless the node may
// `request-serviceaccounts-podcertificate-signer` on it (the signer's name with "/" as ":", as a resource).
// A UID that differs may be the informers' lag, so that is an error a retry may clear (500), not a 403.
func (p *nodeRestriction) admitPodCertificateRequest(ctx context.Context, nodeName string, a admission.Attributes) error {
	if a.GetOperation() != admission.Create {
		return admission.NewForbidden(a, fmt.Errorf("unexpected operation %v", a.GetOperation()))
	}
	if a.GetSubresource() != "" {
		return admission.NewForbidden(a, fmt.Errorf("unexpected subresource %v", a.GetSubresource()))
	}
	req, ok := a.GetObject().(*certificatesv1.PodCertificateRequest)
	if !ok {
		return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetObject()))
	}
	pc := p.podCertificates
	if pc == nil {
		return admission.NewForbidden(a, fmt.Errorf("nodes may not create PodCertificateRequests here"))
	}
	namespace := a.GetNamespace()
	podKey := namespace + "/" + req.Spec.PodName
	if string(req.Spec.NodeName) != nodeName {
		return admission.NewForbidden(a, fmt.Errorf("PodCertificateRequest.Spec.NodeName=%q, which is not the requesting node %q", req.Spec.NodeName, nodeName))
	}
	node, err := pc.nodes.Get(nodeName)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("while retrieving node %q named in the PodCertificateRequest: %w", nodeName, err)
	} else if err != nil {
		return admission.NewForbidden(a, fmt.Errorf("while retrieving node %q named in the PodCertificateRequest: %w", nodeName, err))
	}
	if node.UID != req.Spec.NodeUID {
		return fmt.Errorf("PodCertificateRequest for pod %q names node UID %q, inconsistent with the running node (%q)", podKey, req.Spec.NodeUID, node.UID)
	}
	pod, err := p.pods.Pods(namespace).Get(req.Spec.PodName)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("while retrieving pod %q named in the PodCertificateRequest: %w", podKey, err)
	} else if err != nil {
		return admission.NewForbidden(a, fmt.Errorf("while retrieving pod %q named in the PodCertificateRequest: %w", podKey, err))
	}
	if req.Spec.PodUID != pod.UID {
		return fmt.Errorf("PodCertificateRequest for pod %q contains pod UID (%q) which differs from running pod %q", podKey, req.Spec.PodUID, pod.UID)
	}
	if pod.Spec.NodeName != nodeName {
		return admission.NewForbidden(a, fmt.Errorf("pod %q is not running on node %q named in the PodCertificateRequest", podKey, req.Spec.NodeName))
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return admission.NewForbidden(a, fmt.Errorf("pod %q is a mirror pod", podKey))
	}
	if req.Spec.ServiceAccountName != pod.Spec.ServiceAccountName {
		return admission.NewForbidden(a, fmt.Errorf("PodCertificateRequest for pod %q contains serviceAccountName (%q) that differs from running pod (%q)", podKey, req.Spec.ServiceAccountName, pod.Spec.ServiceAccountName))
	}
	sa, err := pc.serviceAccounts.ServiceAccounts(namespace).Get(req.Spec.ServiceAccountName)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("while retrieving service account %q named in the PodCertificateRequest: %w", namespace+"/"+req.Spec.ServiceAccountName, err)
	} else if err != nil {
		return admission.NewForbidden(a, fmt.Errorf("while retrieving service account %q named in the PodCertificateRequest: %w", namespace+"/"+req.Spec.ServiceAccountName, err))
	}
	if req.Spec.ServiceAccountUID != sa.UID {
		return fmt.Errorf("PodCertificateRequest for pod %q names service account UID %q, which differs from the running service account (%q)", podKey, req.Spec.ServiceAccountUID, sa.UID)
	}
	if mountsPodCertificate(pod, req.Spec.SignerName) {
		return nil
	}
	decision, _, err := pc.authz.Authorize(ctx, authorizer.AttributesRecord{
		User: a.GetUserInfo(), Verb: "request-serviceaccounts-podcertificate-signer",
		APIGroup: a.GetResource().Group, APIVersion: a.GetResource().Version,
		Resource: strings.ReplaceAll(req.Spec.SignerName, "/", ":"), Namespace: namespace, Name: req.Spec.ServiceAccountName,
		ResourceRequest: true,
	})
	if decision == authorizer.DecisionAllow {
		return nil
	}
	if err != nil {
		return admission.NewForbidden(a, fmt.Errorf("error authorizing %s to request podcertificaterequests for signer %q: %w", a.GetUserInfo().GetName(), req.Spec.SignerName, err))
	}
	return admission.NewForbidden(a, fmt.Errorf("pod %q does not mount a podCertificate projected volume for signer %q", podKey, req.Spec.SignerName))
}

// mountsPodCertificate says whether a pod has a podCertificate projection for the signer.
func mountsPodCertificate(pod *corev1.Pod, signerName string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.PodCertificate != nil && src.PodCertificate.SignerName == signerName {
				return true
			}
		}
	}
	return false
}

// admitResourceSlice lets a node (its DRA drivers) create and delete only the ResourceSlices of its own
// node, as Kubernetes' NodeRestriction does: the Node authorizer allows any create, since it does not see the
// object, and checks the other verbs against its graph of slices (auth.feedNodeGraph); a deletecollection is
// admitted object by object here.
func admitResourceSlice(nodeName string, a admission.Attributes) error {
	var obj any
	switch a.GetOperation() {
	case admission.Create:
		obj = a.GetObject()
	case admission.Delete:
		obj = a.GetOldObject()
	default:
		return nil
	}
	slice, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", obj))
	}
	if slice.Spec.NodeName == nil || *slice.Spec.NodeName != nodeName {
		verb := "create"
		if a.GetOperation() == admission.Delete {
			verb = "delete"
		}
		return admission.NewForbidden(a, fmt.Errorf("can only %s ResourceSlice with the same NodeName as the requesting node", verb))
	}
	return nil
}

// admitVolume lets a node create, and delete, only PersistentVolumes whose required node affinity is its
// own kubernetes.io/hostname: the local volumes it provisions.
func (p *nodeRestriction) admitVolume(nodeName string, a admission.Attributes) error {
	var pv *corev1.PersistentVolume
	switch a.GetOperation() {
	case admission.Create:
		pv, _ = a.GetObject().(*corev1.PersistentVolume)
	case admission.Delete:
		var err error
		if pv, err = p.volumes.Get(a.GetName()); apierrors.IsNotFound(err) {
			return err
		} else if err != nil {
			return admission.NewForbidden(a, err)
		}
	default:
		return admission.NewForbidden(a, fmt.Errorf("node %q may only create and delete PersistentVolumes", nodeName))
	}
	if pv == nil || !pinnedTo(pv, nodeName) {
		return admission.NewForbidden(a, fmt.Errorf("node %q may only create and delete PersistentVolumes whose node affinity requires %s=%s", nodeName, corev1.LabelHostname, nodeName))
	}
	return nil
}

// pinnedTo says whether a volume's required node affinity is exactly one term matching the node's
// kubernetes.io/hostname label with one value.
func pinnedTo(pv *corev1.PersistentVolume, nodeName string) bool {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return false
	}
	term := na.Required.NodeSelectorTerms[0]
	if len(term.MatchExpressions) != 1 || len(term.MatchFields) != 0 {
		return false
	}
	e := term.MatchExpressions[0]
	return e.Key == corev1.LabelHostname && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 && e.Values[0] == nodeName
}

// nodeDNSSlicePrefix names the EndpointSlice of kube-dns in which an agent publishes its node's DNS
// address: kube-dns-<node> (nodeagent/dns.SliceName).
const nodeDNSSlicePrefix = "kube-dns-"

// admitNodeDNSSlice lets a node write only its own kube-dns EndpointSlice in kube-system.
func admitNodeDNSSlice(nodeName string, a admission.Attributes) error {
	name := a.GetName()
	if obj, ok := a.GetObject().(*discoveryv1.EndpointSlice); ok && a.GetOperation() == admission.Create {
		name = obj.Name
	}
	if a.GetNamespace() != metav1.NamespaceSystem || name != nodeDNSSlicePrefix+nodeName {
		return admission.NewForbidden(a, fmt.Errorf("node %q may only write the EndpointSlice %s/%s%s", nodeName, metav1.NamespaceSystem, nodeDNSSlicePrefix, nodeName))
	}
	return nil
}

// boundPod is a pod the request names, from the informer, as the library reads it.
func (p *nodeRestriction) boundPod(a admission.Attributes, name string) (*corev1.Pod, error) {
	pod, err := p.pods.Pods(a.GetNamespace()).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, err
	}
	if err != nil {
		return nil, admission.NewForbidden(a, err)
	}
	return pod, nil
}

func (p *nodeRestriction) admitPod(nodeName string, a admission.Attributes) error {
	switch a.GetOperation() {
	case admission.Create:
		pod, ok := a.GetObject().(*corev1.Pod)
		if !ok {
			return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetObject()))
		}
		if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; !mirror {
			return admission.NewForbidden(a, fmt.Errorf("pod does not have %q annotation, node %q can only create mirror pods", corev1.MirrorPodAnnotationKey, nodeName))
		}
		return admission.NewForbidden(a, fmt.Errorf("node %q may not create mirror pods: Skiff runs no static pods", nodeName))
	case admission.Delete:
		pod, err := p.boundPod(a, a.GetName())
		if err != nil {
			return err
		}
		if pod.Spec.NodeName != nodeName {
			return admission.NewForbidden(a, fmt.Errorf("node %q can only delete pods with spec.nodeName set to itself", nodeName))
		}
		return nil
	default:
		return admission.NewForbidden(a, fmt.Errorf("unexpected operation %q, node %q can only create and delete mirror pods", a.GetOperation(), nodeName))
	}
}

func (p *nodeRestriction) admitPodStatus(nodeName string, a admission.Attributes) error {
	if a.GetOperation() != admission.Update {
		return admission.NewForbidden(a, fmt.Errorf("unexpected operation %q", a.GetOperation()))
	}
	oldPod, ok := a.GetOldObject().(*corev1.Pod)
	if !ok {
		return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetOldObject()))
	}
	if oldPod.Spec.NodeName != nodeName {
		return admission.NewForbidden(a, fmt.Errorf("node %q can only update pod status for pods with spec.nodeName set to itself", nodeName))
	}
	newPod, ok := a.GetObject().(*corev1.Pod)
	if !ok {
		return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetObject()))
	}
	if !labels.Equals(oldPod.Labels, newPod.Labels) {
		return admission.NewForbidden(a, fmt.Errorf("node %q cannot update labels through pod status", nodeName))
	}
	return nil
}

func (p *nodeRestriction) admitPodEviction(nodeName string, a admission.Attributes) error {
	if a.GetOperation() != admission.Create {
		return admission.NewForbidden(a, fmt.Errorf("unexpected operation %s", a.GetOperation()))
	}
	podName := a.GetName()
	if podName == "" {
		if eviction, ok := a.GetObject().(*policyv1.Eviction); ok {
			podName = eviction.Name
		}
		if podName == "" {
			return admission.NewForbidden(a, fmt.Errorf("could not determine pod from request data"))
		}
	}
	pod, err := p.boundPod(a, podName)
	if err != nil {
		return err
	}
	if pod.Spec.NodeName != nodeName {
		return admission.NewForbidden(a, fmt.Errorf("node %s can only evict pods with spec.nodeName set to itself", nodeName))
	}
	return nil
}

func (p *nodeRestriction) admitNode(nodeName string, a admission.Attributes) error {
	if a.GetName() != nodeName {
		return admission.NewForbidden(a, fmt.Errorf("node %q is not allowed to modify node %q", nodeName, a.GetName()))
	}
	switch a.GetOperation() {
	case admission.Create:
		node, ok := a.GetObject().(*corev1.Node)
		if !ok {
			return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetObject()))
		}
		if node.Spec.ConfigSource != nil {
			return admission.NewForbidden(a, fmt.Errorf("node %q is not allowed to create pods with a non-nil configSource", nodeName))
		}
		if forbidden := forbiddenNodeLabels(node.Labels, nil); len(forbidden) > 0 {
			return admission.NewForbidden(a, fmt.Errorf("node %q is not allowed to set the following labels: %s", nodeName, strings.Join(forbidden, ", ")))
		}
	case admission.Update:
		node, ok := a.GetObject().(*corev1.Node)
		if !ok {
			return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetObject()))
		}
		old, ok := a.GetOldObject().(*corev1.Node)
		if !ok {
			return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetOldObject()))
		}
		if node.Spec.ConfigSource != nil && !apiequality.Semantic.DeepEqual(node.Spec.ConfigSource, old.Spec.ConfigSource) {
			return admission.NewForbidden(a, fmt.Errorf("node %q is not allowed to update configSource to a new non-nil configSource", nodeName))
		}
		if !apiequality.Semantic.DeepEqual(node.Spec.Taints, old.Spec.Taints) {
			return admission.NewForbidden(a, fmt.Errorf("node %q is not allowed to modify taints", nodeName))
		}
		if !apiequality.Semantic.DeepEqual(node.OwnerReferences, old.OwnerReferences) {
			return admission.NewForbidden(a, fmt.Errorf("node %q is not allowed to modify ownerReferences", nodeName))
		}
		if forbidden := forbiddenNodeLabels(node.Labels, old.Labels); len(forbidden) > 0 {
			return admission.NewForbidden(a, fmt.Errorf("is not allowed to modify labels: %s", strings.Join(forbidden, ", ")))
		}
	}
	return nil
}

// forbiddenNodeLabels are the labels that differ between two label sets and that a node may not set:
// node-restriction.kubernetes.io/ ones, and kubernetes.io/ and k8s.io/ ones that are not the kubelet's own.
func forbiddenNodeLabels(labels, old map[string]string) []string {
	var forbidden []string
	check := func(key string) {
		if labels[key] == old[key] && hasKey(labels, key) == hasKey(old, key) {
			return
		}
		prefix, _, ok := strings.Cut(key, "/")
		if !ok {
			return
		}
		restricted := prefix == corev1.LabelNamespaceNodeRestriction || strings.HasSuffix(prefix, "."+corev1.LabelNamespaceNodeRestriction)
		kubernetes := prefix == "kubernetes.io" || strings.HasSuffix(prefix, ".kubernetes.io") || prefix == "k8s.io" || strings.HasSuffix(prefix, ".k8s.io")
		if (restricted || (kubernetes && !kubeletapis.IsKubeletLabel(key))) && !slices.Contains(forbidden, key) {
			forbidden = append(forbidden, key)
		}
	}
	for key := range labels {
		check(key)
	}
	for key := range old {
		check(key)
	}
	slices.Sort(forbidden)
	return forbidden
}

func hasKey(m map[string]string, key string) bool {
	_, ok := m[key]
	return ok
}

// admitServiceAccountToken lets a node request only tokens bound to a pod that runs on it.
func (p *nodeRestriction) admitServiceAccountToken(nodeName string, a admission.Attributes) error {
	if a.GetOperation() != admission.Create || a.GetSubresource() != "token" {
		return nil
	}
	tr, ok := a.GetObject().(*authenticationv1.TokenRequest)
	if !ok {
		return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetObject()))
	}
	ref := tr.Spec.BoundObjectRef
	if ref == nil || ref.APIVersion != "v1" || ref.Kind != "Pod" || ref.Name == "" {
		return admission.NewForbidden(a, fmt.Errorf("node requested token not bound to a pod"))
	}
	if ref.UID == "" {
		return admission.NewForbidden(a, fmt.Errorf("node requested token with a pod binding without a uid"))
	}
	pod, err := p.boundPod(a, ref.Name)
	if err != nil {
		return err
	}
	if ref.UID != pod.UID {
		return admission.NewForbidden(a, fmt.Errorf("the UID in the bound object reference (%s) does not match the UID in record. The object might have been deleted and then recreated", ref.UID))
	}
	if pod.Spec.NodeName != nodeName {
		return admission.NewForbidden(a, fmt.Errorf("node requested token bound to a pod scheduled on a different node"))
	}
	return nil
}

// admitNodeLease lets a node touch only its own lease in kube-node-lease.
func admitNodeLease(nodeName string, a admission.Attributes) error {
	if a.GetNamespace() != corev1.NamespaceNodeLease {
		return admission.NewForbidden(a, fmt.Errorf("can only access leases in the %q system namespace", corev1.NamespaceNodeLease))
	}
	name := a.GetName()
	if a.GetOperation() == admission.Create {
		lease, ok := a.GetObject().(*coordinationv1.Lease)
		if !ok {
			return admission.NewForbidden(a, fmt.Errorf("unexpected type %T", a.GetObject()))
		}
		name = lease.Name
	}
	if name != nodeName {
		return admission.NewForbidden(a, fmt.Errorf("can only access node lease with the same name as the requesting node"))
	}
	return nil
}
