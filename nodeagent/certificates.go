package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/kubernetes/pkg/kubelet/clustertrustbundle"
	"k8s.io/kubernetes/pkg/kubelet/podcertificate"
	"k8s.io/utils/clock"
)

// The clusterTrustBundle and podCertificate sources of projected volumes, served by the kubelet's own managers
// (k8s.io/kubernetes/pkg/kubelet/clustertrustbundle and pkg/kubelet/podcertificate), which work on v1 objects
// through client-go:
//
//   - a clusterTrustBundle source is the PEM certificates of one bundle (by name) or of every bundle of a
//     signer whose labels the selector matches (a nil selector matches none, an empty one all), deduplicated,
//     as the kubelet writes them. The bundles come from an informer started on first use; a missing bundle,
//     or a selection of none, fails the volume unless the source is optional (then the file is empty).
//   - a podCertificate source is a private key of the asked type that the agent generates, and the
//     certificate chain a signer issues for it: the manager creates a PodCertificateRequest naming the pod,
//     its service account and the node by name and UID (NodeRestriction checks them), waits for the
//     request's Issued condition, and from status.beginRefreshAt on asks again with a new key. Until the first
//     chain is issued the volume fails to set up and the pod's sync retries; a request's change kicks the
//     pod's sync, which writes what the manager holds (the periodic resync carries refreshes too).
//
// The managers keep their state in memory, as the kubelet's do: after an agent restart a pod's certificate
// is requested anew.

// certificateSource serves a projected volume's clusterTrustBundle and podCertificate sources.
type certificateSource interface {
	// TrustAnchors is the PEM bundle of a clusterTrustBundle source.
	TrustAnchors(ctx context.Context, src *corev1.ClusterTrustBundleProjection) ([]byte, error)
	// PodCredentials is the PEM private key and certificate chain of the pod's podCertificate source
	// sourceIndex of volume, from the latest certificate issued; it starts the issuance if need be.
	PodCredentials(ctx context.Context, pod *corev1.Pod, podDir, volume string, sourceIndex int) (key, chain []byte, err error)
}

// certificateSourceOf is the getter as a certificateSource, or nil.
func certificateSourceOf(get objectGetter) certificateSource {
	if c, ok := get.(*cachingGetter); ok {
		get = c.get
	}
	if o, ok := get.(apiObjects); ok && o.certs == nil {
		return nil
	}
	source, _ := get.(certificateSource)
	return source
}

func (o apiObjects) TrustAnchors(ctx context.Context, src *corev1.ClusterTrustBundleProjection) ([]byte, error) {
	return o.certs.TrustAnchors(ctx, src)
}

func (o apiObjects) PodCredentials(ctx context.Context, pod *corev1.Pod, podDir, volume string, sourceIndex int) ([]byte, []byte, error) {
	return o.certs.PodCredentials(ctx, pod, podDir, volume, sourceIndex)
}

// nodeCertificates is the certificateSource of one node: kube's managers, started on first use.
type nodeCertificates struct {
	ctx      context.Context // the agent's
	client   kubernetes.Interface
	recorder record.EventRecorder
	nodeName string
	// kick asks for a sync of the pod "namespace/name" after a delay.
	kick func(key string, after time.Duration)

	bundles clustertrustbundle.Manager

	start    sync.Once
	issuing  *podcertificate.IssuingManager
	startErr error

	mu   sync.Mutex
	pods map[types.UID]trackedPod // the pods whose podCertificate sources are served
}

// trackedPod is a pod with podCertificate sources, as its last sync saw it, and its directory.
type trackedPod struct {
	pod    *corev1.Pod
	podDir string
}

// allNodeCertificates are the agents' sources, for teardownVolumes (agents sharing a process in tests each
// have their own; a pod directory belongs to one of them).
var allNodeCertificates struct {
	mu      sync.Mutex
	sources []*nodeCertificates
}

// newNodeCertificates serves the projections of the pods of node nodeName; ctx is the agent's.
func newNodeCertificates(ctx context.Context, client kubernetes.Interface, recorder record.EventRecorder, nodeName string,
	kick func(key string, after time.Duration)) *nodeCertificates {
	c := &nodeCertificates{ctx: ctx, client: client, recorder: recorder, nodeName: nodeName, kick: kick,
		bundles: clustertrustbundle.NewLazyInformerManager(ctx, client, 256), pods: map[types.UID]trackedPod{}}
	allNodeCertificates.mu.Lock()
	allNodeCertificates.sources = append(allNodeCertificates.sources, c)
	allNodeCertificates.mu.Unlock()
	context.AfterFunc(ctx, func() {
		allNodeCertificates.mu.Lock()
		defer allNodeCertificates.mu.Unlock()
		for i, s := range allNodeCertificates.sources {
			if s == c {
				allNodeCertificates.sources = append(allNodeCertificates.sources[:i], allNodeCertificates.sources[i+1:]...)
				break
			}
		}
	})
	return c
}

// TrustAnchors reads the bundles as the kubelet's projected volume plugin does.
func (c *nodeCertificates) TrustAnchors(ctx context.Context, src *corev1.ClusterTrustBundleProjection) ([]byte, error) {
	optional := src.Optional != nil && *src.Optional
	switch {
	case src.Name != nil:
		return c.bundles.GetTrustAnchorsByName(ctx, *src.Name, optional)
	case src.SignerName != nil && src.LabelSelector == nil:
		// A nil selector matches nothing. Answered here: the manager caches a selection by its selector's
		// string, which is the same for nothing and for everything.
		if optional {
			return []byte{}, nil
		}
		return nil, errors.New("combination of signerName and labelSelector matched zero ClusterTrustBundles")
	case src.SignerName != nil:
		return c.bundles.GetTrustAnchorsBySigner(ctx, *src.SignerName, src.LabelSelector, optional)
	}
	return nil, errors.New("ClusterTrustBundle projection requires either name or signerName to be set")
}

// PodCredentials tracks the pod (its latest spec, for the manager) and returns what the manager holds.
func (c *nodeCertificates) PodCredentials(ctx context.Context, pod *corev1.Pod, podDir, volume string, sourceIndex int) ([]byte, []byte, error) {
	issuing, err := c.issuingManager()
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	c.pods[pod.UID] = trackedPod{pod: pod.DeepCopy(), podDir: podDir}
	c.mu.Unlock()
	issuing.TrackPod(ctx, pod)
	key, chain, err := issuing.GetPodCertificateCredentialBundle(ctx, pod.Namespace, pod.Name, string(pod.UID), volume, sourceIndex)
	if err != nil {
		return nil, nil, fmt.Errorf("pod certificate for signer of source %d: %w", sourceIndex, err)
	}
	return key, chain, nil
}

// issuingManager starts kube's pod certificate manager on first use: informers of the node's
// PodCertificateRequests (the Node authorizer lets a node list and watch only those naming it) and of its Node
// (for its UID).
func (c *nodeCertificates) issuingManager() (*podcertificate.IssuingManager, error) {
	c.start.Do(func() {
		byNode := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", c.nodeName).String()
		}))
		node := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.nodeName).String()
		}))
		requests := byNode.Certificates().V1().PodCertificateRequests()
		c.issuing = podcertificate.NewIssuingManager(c.client, (*trackedPods)(c), c.recorder, requests, node.Core().V1().Nodes(),
			types.NodeName(c.nodeName), clock.RealClock{})
		// The manager reacts to a request's change on its own queue; the pod's sync then writes what it
		// holds. A short delay lets the manager take the change first.
		_, c.startErr = requests.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, obj any) { c.kickRequester(obj) },
		})
		byNode.Start(c.ctx.Done())
		node.Start(c.ctx.Done())
		go c.issuing.Run(c.ctx)
	})
	return c.issuing, c.startErr
}

func (c *nodeCertificates) kickRequester(obj any) {
	pcr, ok := obj.(*certificatesv1.PodCertificateRequest)
	if !ok {
		return
	}
	c.mu.Lock()
	tracked, ok := c.pods[pcr.Spec.PodUID]
	c.mu.Unlock()
	if ok {
		key := tracked.pod.Namespace + "/" + tracked.pod.Name
		c.kick(key, 300*time.Millisecond)
		c.kick(key, 2*time.Second)
	}
}

// forget drops the pods whose directory is podDir: their volumes are being torn down.
func (c *nodeCertificates) forget(podDir string) {
	c.mu.Lock()
	var gone []*corev1.Pod
	for uid, tracked := range c.pods {
		if tracked.podDir == podDir {
			gone = append(gone, tracked.pod)
			delete(c.pods, uid)
		}
	}
	issuing := c.issuing
	c.mu.Unlock()
	for _, pod := range gone {
		if issuing != nil {
			issuing.ForgetPod(c.ctx, pod)
		}
	}
}

// forgetPodCertificates stops serving the certificates of the pod whose directory is podDir.
func forgetPodCertificates(podDir string) {
	allNodeCertificates.mu.Lock()
	sources := append([]*nodeCertificates(nil), allNodeCertificates.sources...)
	allNodeCertificates.mu.Unlock()
	for _, c := range sources {
		c.forget(podDir)
	}
}

// trackedPods is the pod manager kube's IssuingManager asks: the pods whose podCertificate sources this node
// serves.
type trackedPods nodeCertificates

func (t *trackedPods) GetPodByUID(uid types.UID) (*corev1.Pod, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tracked, ok := t.pods[uid]
	return tracked.pod, ok
}

func (t *trackedPods) GetPods() []*corev1.Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(t.pods))
	for _, tracked := range t.pods {
		pods = append(pods, tracked.pod)
	}
	return pods
}

// certificatePayload is what a clusterTrustBundle or podCertificate source adds to its volume, with the
// kubelet's modes: the volume's default mode, or 0600 in a pod with an fsGroup.
func (s *volumeSetup) certificatePayload(volume string, sourceIndex int, src *corev1.VolumeProjection, defaultMode fs.FileMode) (map[string]fileProjection, error) {
	mode := defaultMode
	if s.fsGroup() != nil {
		mode = 0o600
	}
	switch {
	case src.ClusterTrustBundle != nil:
		anchors, err := s.certs.TrustAnchors(s.ctx, src.ClusterTrustBundle)
		if err != nil {
			return nil, err
		}
		return map[string]fileProjection{src.ClusterTrustBundle.Path: {data: anchors, mode: mode}}, nil
	case src.PodCertificate != nil:
		pc := src.PodCertificate
		key, chain, err := s.certs.PodCredentials(s.ctx, s.pod, filepath.Dir(s.root), volume, sourceIndex)
		if err != nil {
			return nil, err
		}
		part := map[string]fileProjection{}
		if pc.CredentialBundlePath != "" {
			part[pc.CredentialBundlePath] = fileProjection{data: bytes.Join([][]byte{key, chain}, nil), mode: mode}
		}
		if pc.KeyPath != "" {
			part[pc.KeyPath] = fileProjection{data: key, mode: mode}
		}
		if pc.CertificateChainPath != "" {
			part[pc.CertificateChainPath] = fileProjection{data: chain, mode: mode}
		}
		return part, nil
	}
	return nil, errors.New("not a certificate projection")
}

// checkCertificateProjection checks what the agent needs of a clusterTrustBundle or podCertificate source
// (the API validated the rest).
func checkCertificateProjection(i, j int, ps *corev1.VolumeProjection) error {
	at := fmt.Sprintf("spec.volumes[%d].projected.sources[%d]", i, j)
	switch {
	case ps.ClusterTrustBundle != nil:
		if ps.ClusterTrustBundle.Path == "" {
			return fmt.Errorf("%s.clusterTrustBundle.path: Required value", at)
		}
		if ps.ClusterTrustBundle.Name == nil && ps.ClusterTrustBundle.SignerName == nil {
			return fmt.Errorf("%s.clusterTrustBundle: Required value: either name or signerName must be specified", at)
		}
	case ps.PodCertificate != nil:
		pc := ps.PodCertificate
		if pc.CredentialBundlePath == "" && pc.KeyPath == "" && pc.CertificateChainPath == "" {
			return fmt.Errorf("%s.podCertificate: Required value: credentialBundlePath, or keyPath and certificateChainPath", at)
		}
		if !strings.Contains(pc.SignerName, "/") {
			return fmt.Errorf("%s.podCertificate.signerName: Invalid value: %q", at, pc.SignerName)
		}
	}
	return nil
}
