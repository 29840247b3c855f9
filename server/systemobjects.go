package server

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	utilptr "k8s.io/utils/ptr"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/apiserver/raftstore"
	"github.com/skiff-dev/skiff/controller"
	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/servicecidr"
	"github.com/skiff-dev/skiff/scheduler"
)

// systemNamespaces exist in every cluster, as in Kubernetes.
var systemNamespaces = []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease}

// leaderLeaseName is the Lease in kube-system through which the Raft leader says who leads.
const leaderLeaseName = "skiff-leader"

// leaseRenewInterval is how often the leader renews its Lease; the Lease says it is valid for three times
// as long.
const leaseRenewInterval = 5 * time.Second

// runSystemObjects is a leader service: through the API, as any component would, it creates the system
// namespaces and the default StorageClass, and keeps the leader Lease current.
func (s *Server) runSystemObjects(ctx context.Context) {
	client, err := s.adminClient(ctx)
	if err != nil {
		return
	}
	for _, name := range systemNamespaces {
		for ctx.Err() == nil {
			_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
			s.logger.Warn("creating system namespace", "namespace", name, "error", err)
			sleepCtx(ctx, time.Second)
		}
	}
	for ctx.Err() == nil {
		err := ensureLocalPathClass(ctx, client)
		if err == nil {
			break
		}
		s.logger.Warn("creating the local-path StorageClass", "error", err)
		sleepCtx(ctx, time.Second)
	}
	acquired := metav1.NewMicroTime(time.Now())
	first := true
	for ctx.Err() == nil {
		if err := s.renewLeaderLease(ctx, client, acquired, first); err != nil {
			s.logger.Warn("renewing the leader lease", "error", err)
		} else {
			first = false
		}
		if err := s.reconcileKubernetesService(ctx, client); err != nil {
			s.logger.Warn("reconciling the kubernetes service", "error", err)
		}
		if err := s.reconcileClusterDNS(ctx, client); err != nil {
			s.logger.Warn("reconciling the cluster DNS objects", "error", err)
		}
		sleepCtx(ctx, leaseRenewInterval)
	}
}

// reconcileKubernetesService keeps default/kubernetes, the Service pods reach the API through: the first
// address of the service CIDR, with one endpoint per alive server.
func (s *Server) reconcileKubernetesService(ctx context.Context, client kubernetes.Interface) error {
	first, err := servicecidr.KubernetesServiceIP(s.cfg.ServiceCIDR)
	if err != nil {
		return err
	}
	services := client.CoreV1().Services(metav1.NamespaceDefault)
	if _, err := services.Get(ctx, "kubernetes", metav1.GetOptions{}); apierrors.IsNotFound(err) {
		_, err = services.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Labels: map[string]string{"component": "apiserver", "provider": "kubernetes"}},
			Spec: corev1.ServiceSpec{ClusterIP: first.String(), Ports: []corev1.ServicePort{{
				Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(int32(s.cfg.Ports.API)),
			}}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	} else if err != nil {
		return err
	}
	var addrs []corev1.EndpointAddress
	for _, m := range s.pool.Alive(gossip.RoleServer) {
		if host, _, err := net.SplitHostPort(m.Meta.APIAddr); err == nil {
			addrs = append(addrs, corev1.EndpointAddress{IP: host})
		}
	}
	want := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault},
		Subsets: []corev1.EndpointSubset{{Addresses: addrs, Ports: []corev1.EndpointPort{
			{Name: "https", Port: int32(s.cfg.Ports.API), Protocol: corev1.ProtocolTCP},
		}}},
	}
	endpoints := client.CoreV1().Endpoints(metav1.NamespaceDefault)
	have, err := endpoints.Get(ctx, "kubernetes", metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err = endpoints.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return err
		}
	case err != nil:
		return err
	case !apiequality.Semantic.DeepEqual(have.Subsets, want.Subsets):
		have.Subsets = want.Subsets
		if _, err = endpoints.Update(ctx, have, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return reconcileKubernetesSlice(ctx, client, addrs, int32(s.cfg.Ports.API))
}

// reconcileKubernetesSlice keeps the EndpointSlice of default/kubernetes beside its Endpoints, as
// kube-apiserver does: the service proxy reads only EndpointSlices.
func reconcileKubernetesSlice(ctx context.Context, client kubernetes.Interface, addrs []corev1.EndpointAddress, port int32) error {
	ready := true
	want := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault, Labels: map[string]string{
			discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "skiff-apiserver",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: utilptr.To("https"), Port: &port, Protocol: utilptr.To(corev1.ProtocolTCP)}},
	}
	for _, a := range addrs {
		want.Endpoints = append(want.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.IP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	slices := client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault)
	have, err := slices.Get(ctx, "kubernetes", metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = slices.Create(ctx, want, metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	case apiequality.Semantic.DeepEqual(have.Endpoints, want.Endpoints) && apiequality.Semantic.DeepEqual(have.Ports, want.Ports):
		return nil
	}
	have.Endpoints, have.Ports = want.Endpoints, want.Ports
	_, err = slices.Update(ctx, have, metav1.UpdateOptions{})
	return err
}

// ClusterConfigMap is the kube-system ConfigMap through which servers tell node agents the cluster's
// addressing: the keys below. Agents read it at start and watch it.
const ClusterConfigMap = "skiff-cluster"

// reconcileClusterDNS creates what the node agents' DNS needs: the skiff-cluster ConfigMap with the cluster
// DNS address and domain, and the kube-system/kube-dns Service at cluster_dns. The Service has no selector:
// each agent publishes its own DNS endpoint in an EndpointSlice, and internalTrafficPolicy Local sends a
// pod's queries to the DNS of its own node. Existing objects are updated only where the configuration
// changed, so an operator's labels and annotations stay.
func (s *Server) reconcileClusterDNS(ctx context.Context, client kubernetes.Interface) error {
	data := map[string]string{
		"clusterDNS": s.cfg.ClusterDNS, "clusterDomain": s.cfg.ClusterDomain,
		"serviceCIDR": s.cfg.ServiceCIDR, "clusterCIDR": s.cfg.ClusterCIDR,
	}
	configMaps := client.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	cm, err := configMaps.Get(ctx, ClusterConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = configMaps.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ClusterConfigMap}, Data: data}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	case err != nil:
		return err
	case !apiequality.Semantic.DeepEqual(cm.Data, data):
		cm.Data = data
		if _, err := configMaps.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	services := client.CoreV1().Services(metav1.NamespaceSystem)
	if _, err := services.Get(ctx, "kube-dns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return err // exists (a changed cluster_dns needs the Service deleted: a ClusterIP is immutable)
	}
	local := corev1.ServiceInternalTrafficPolicyLocal
	_, err = services.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Labels: map[string]string{
			"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS", "kubernetes.io/cluster-service": "true",
		}},
		Spec: corev1.ServiceSpec{ClusterIP: s.cfg.ClusterDNS, InternalTrafficPolicy: &local, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
		}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func (s *Server) renewLeaderLease(ctx context.Context, client kubernetes.Interface, acquired metav1.MicroTime, first bool) error {
	leases := client.CoordinationV1().Leases(metav1.NamespaceSystem)
	now := metav1.NewMicroTime(time.Now())
	holder := s.cfg.Name
	duration := int32(3 * leaseRenewInterval / time.Second)
	lease, err := leases.Get(ctx, leaderLeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: leaderLeaseName, Namespace: metav1.NamespaceSystem},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration,
				AcquireTime: &acquired, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if first && (lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != holder) {
		transitions := int32(0)
		if lease.Spec.LeaseTransitions != nil {
			transitions = *lease.Spec.LeaseTransitions
		}
		transitions++
		lease.Spec.LeaseTransitions = &transitions
		lease.Spec.AcquireTime = &acquired
	}
	lease.Spec.HolderIdentity = &holder
	lease.Spec.LeaseDurationSeconds = &duration
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// runControllers is a leader service: the controller manager, through this peer's API, as
// system:kube-controller-manager, each controller as its own service account.
func (s *Server) runControllers(ctx context.Context) {
	shared, err := s.leaderInformers(ctx)
	if err != nil {
		return
	}
	// The other services start the shared informers once the controllers are built, or at once if they are
	// not to be.
	defer shared.markStarted()
	cfg, err := s.identityRESTConfig(ctx, controllerManagerIdentity)
	if err != nil {
		return
	}
	cfg.UserAgent = "kube-controller-manager/" + s.cfg.Name
	clients, err := controller.NewClients(cfg, s.logger.Named("controller"))
	if err != nil {
		s.logger.Error("building controller clients", "error", err)
		return
	}
	clients.Informers, clients.InformersStarted = shared.factory, shared.markStarted
	clients.ConfigFor = func(serviceAccount string) (*rest.Config, error) {
		cfg, err := s.identityRESTConfig(ctx, controllerIdentity(serviceAccount))
		if err == nil {
			cfg.UserAgent = "kube-controller-manager/" + s.cfg.Name + "/" + serviceAccount
		}
		return cfg, err
	}
	clients.Members = s.pool
	clients.NodeLifecycle = controller.NodeLifecycleConfig{LeaseGrace: s.cfg.NodeLeaseGrace, PodGCTimeout: s.cfg.PodGCTimeout}
	clients.QuotaSyncPeriod = s.cfg.ResourceQuotaSyncPeriod
	clients.LoadBalancer = controller.LoadBalancerConfig{Pools: s.cfg.LoadBalancerPools,
		Claims: loadBalancerClaims{apiserver.LoadBalancerClaims(s.node)}}
	if clients.RootCA, _, _, err = s.clusterCA(); err != nil {
		s.logger.Error("reading the cluster CA: kube-root-ca.crt will not be published", "error", err)
	}
	if clients.CertificateSigning, err = s.writeSigningCA(); err != nil {
		s.logger.Error("writing the cluster CA for the certificate signers: CSRs will not be signed", "error", err)
	}
	controller.Run(ctx, clients)
}

// signingCADir is where, under the data dir, the Raft credentials live (raftPKI), and csrSigningDir where the
// leader keeps the cluster CA's certificate and key as files, which Kubernetes' CSR signers read (the data
// dir holds them already, in the Raft store). They differ after a snapshot of another cluster is restored:
// the API takes the restored CA, while Raft keeps the CA its peers hold.
const (
	signingCADir  = "pki"
	csrSigningDir = "pki/csr-signing"
)

// writeSigningCA writes the cluster CA for the certificate signers and says where it is.
func (s *Server) writeSigningCA() (controller.CertificateSigning, error) {
	caPEM, _, key, err := s.clusterCA()
	if err != nil {
		return controller.CertificateSigning{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return controller.CertificateSigning{}, err
	}
	dir := filepath.Join(s.cfg.DataDir, csrSigningDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return controller.CertificateSigning{}, err
	}
	signing := controller.CertificateSigning{CAFile: filepath.Join(dir, "ca.crt"), KeyFile: filepath.Join(dir, "ca.key"), Duration: s.cfg.NodeCertificateTTL}
	if err := writeFileAtomic(signing.CAFile, caPEM); err != nil {
		return controller.CertificateSigning{}, err
	}
	if err := writeFileAtomic(signing.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})); err != nil {
		return controller.CertificateSigning{}, err
	}
	return signing, nil
}

// runScheduler is a leader service: the scheduler, through this peer's API, as system:kube-scheduler.
func (s *Server) runScheduler(ctx context.Context) {
	cfg, err := s.identityRESTConfig(ctx, schedulerIdentity)
	if err != nil {
		return
	}
	cfg.UserAgent = "default-scheduler/" + s.cfg.Name
	// Binds are the scheduler's whole output; the API's in-flight limits, not a client-side rate, bound them.
	cfg.QPS, cfg.Burst = -1, 0
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		s.logger.Error("building scheduler client", "error", err)
		return
	}
	shared, err := s.leaderInformers(ctx)
	if err != nil {
		return
	}
	if err := scheduler.New(scheduler.Config{Client: client, Informers: shared.factory, InformersStarted: shared.started,
		Logger: s.logger.Named("scheduler")}).Run(ctx); err != nil && ctx.Err() == nil {
		s.logger.Error("scheduler stopped", "error", err)
	}
}

func (s *Server) adminRESTConfig(ctx context.Context) (*rest.Config, error) {
	for {
		cfg, err := clientcmd.BuildConfigFromFlags("", s.KubeconfigPath())
		if err == nil {
			cfg.UserAgent = "skiff-leader/" + s.cfg.Name
			// The controllers talk to their own peer; client-go's default of 5 requests a second would
			// make each garbage collection round take seconds.
			cfg.QPS, cfg.Burst = 200, 400
			// Compressing responses the peer sends to itself only costs CPU.
			cfg.DisableCompression = true
			// The system-objects service keeps the core v1 Endpoints of the kubernetes Service, as
			// kube-apiserver does; the API's deprecation warning for it would fill the log every sync.
			cfg.WarningHandler = rest.NoWarnings{}
			return cfg, nil
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

// adminClient waits for this peer's admin kubeconfig and returns a client for it. Leader services reach the
// API through this peer, as the design asks.
func (s *Server) adminClient(ctx context.Context) (kubernetes.Interface, error) {
	cfg, err := s.adminRESTConfig(ctx)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// sleepCtx sleeps for d, or less if ctx ends; it reports whether ctx is still alive.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// localPathProvisioner is the provisioner every node agent runs for its nodes (nodeagent.LocalPathProvisioner).
const localPathProvisioner = "skiff.dev/local-path"

// ensureLocalPathClass creates the default StorageClass, local-path, when it is missing, as k3s ships it: a
// claim of it gets a directory on the node of its first pod (WaitForFirstConsumer), deleted with the claim.
// An existing class of that name is left as the operator made it.
func ensureLocalPathClass(ctx context.Context, client kubernetes.Interface) error {
	reclaim := corev1.PersistentVolumeReclaimDelete
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: "local-path", Annotations: map[string]string{
			"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: localPathProvisioner, ReclaimPolicy: &reclaim, VolumeBindingMode: &mode,
	}
	_, err := client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// loadBalancerClaims are the store's claims on load balancer addresses, as the controller asks for them.
type loadBalancerClaims struct{ *raftstore.Claims }

// Claim gives ip to holder; taken says another Service has it.
func (c loadBalancerClaims) Claim(ctx context.Context, ip, holder string) (taken bool, err error) {
	_, err = c.Claims.Claim(ctx, ip, holder)
	if errors.Is(err, raftstore.ErrClaimed) {
		return true, nil
	}
	return false, err
}
