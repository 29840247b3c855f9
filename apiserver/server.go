package apiserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/endpoints/discovery/aggregated"
	genericapifilters "k8s.io/apiserver/pkg/endpoints/filters"
	apimetrics "k8s.io/apiserver/pkg/endpoints/metrics"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/apiserver/pkg/storage/value"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	"k8s.io/apiserver/pkg/util/notfoundhandler"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	certutil "k8s.io/client-go/util/cert"
	aggregatorapiserver "k8s.io/kube-aggregator/pkg/apiserver"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"
	"k8s.io/kubernetes/pkg/registry/admissionregistration/resolver"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"github.com/skiff-dev/skiff/apiserver/admission"
	"github.com/skiff-dev/skiff/apiserver/aggregator"
	"github.com/skiff-dev/skiff/apiserver/auth"
	"github.com/skiff-dev/skiff/apiserver/extensions"
	"github.com/skiff-dev/skiff/apiserver/openapi"
	"github.com/skiff-dev/skiff/apiserver/raftstore"
	"github.com/skiff-dev/skiff/internal/cachetransform"
	"github.com/skiff-dev/skiff/internal/lbpool"
	"github.com/skiff-dev/skiff/internal/memshare"
)

// KubernetesVersion is the API version Skiff serves: that of the k8s.io/apiserver library it is built on.
const KubernetesVersion = "1.37"

// Config is what one peer's API server needs.
type Config struct {
	Backend  raftstore.Backend
	Listener net.Listener // the API port
	CertPEM  []byte       // serving certificate, issued by the cluster CA
	KeyPEM   []byte
	// ClientCAPEM is the CA whose client certificates authenticate users (the cluster CA).
	ClientCAPEM []byte
	AdminToken  string
	// Transformers turn stored values into what the Raft store holds (encryption at rest, by resource);
	// nil stores them as they are.
	Transformers value.ResourceTransformers
	// Shared holds the objects of the built-in resources' watch caches (memshare.Registry): the API server's
	// own informers share their memory, as may the peer's others (the leader's controllers). Nil: a registry
	// of the API server's own.
	Shared *memshare.Registry
	// JoinToken returns the token node agents join with; agents are refused while it returns "".
	JoinToken func() string
	// ServiceAccountKey returns the key service account tokens are signed with; while it fails, the
	// TokenRequest API answers 503 and no such token is accepted.
	ServiceAccountKey func() (*ecdsa.PrivateKey, error)
	// Handlers are mounted beside the API (operator endpoints); they run behind authentication. A path ending
	// in "/" is a prefix. A "/metrics" handler replaces the library's.
	Handlers map[string]http.Handler
	// ReadyzChecks join /readyz (the Raft read path, for instance).
	ReadyzChecks []healthz.HealthChecker
	// ServiceCIDR is where ClusterIPs come from; DefaultServiceCIDR when empty.
	ServiceCIDR string
	// ClusterCIDR is where Nodes' pod CIDRs (a /24 each) come from; DefaultClusterCIDR when empty.
	ClusterCIDR string
	// LoadBalancerPools are where LoadBalancer Services get their addresses; a Service asking for an address
	// or pool outside them is refused. None: Skiff hands out no addresses and checks none.
	LoadBalancerPools lbpool.Pools
	// EventTTL is how long Events live; one hour when zero.
	EventTTL time.Duration
	// MaxRequestsInFlight and MaxMutatingRequestsInFlight bound the reads and writes served at once (429
	// beyond); the library's defaults (400 and 200) when zero.
	MaxRequestsInFlight, MaxMutatingRequestsInFlight int
	// AgentTransport reaches node agents' HTTPS endpoints (pods' logs, exec, attach, port-forward): it trusts
	// their serving certificates and presents the servers' client certificate. Without it those answer 503.
	AgentTransport http.RoundTripper
	// DefaultTolerationSeconds is how long pods tolerate the not-ready and unreachable taints by default
	// (300 when nil, as in Kubernetes).
	DefaultTolerationSeconds *int64
	// Metrics supplies the figures of the metrics.k8s.io API (kubectl top); the group is not served when nil.
	Metrics MetricsSource
	// RBACPolicyReady, if set, is called once this server has reconciled the bootstrap RBAC policy.
	RBACPolicyReady func()
	// Audit, when set, records requests in an audit log.
	Audit *AuditConfig
	// PodSecurity is the PodSecurity admission's defaults and exemptions; zero means Kubernetes' defaults
	// (privileged, no exemptions).
	PodSecurity PodSecurityConfig
	// FrontProxyCAPEM signs FrontProxyClientCertFile, the client certificate (CN FrontProxyClientName) that
	// the aggregator shows extension API servers behind APIServices, with FrontProxyClientKeyFile; extension
	// servers learn the CA from kube-system/extension-apiserver-authentication. Without them such servers
	// see no identity.
	FrontProxyCAPEM                                   []byte
	FrontProxyClientCertFile, FrontProxyClientKeyFile string
}

// PodSecurityConfig is the server's PodSecurity defaults and exemptions (server HCL pod_security).
type PodSecurityConfig = admission.PodSecurityConfig

// Server is a running Kubernetes API on one peer: the chain's outermost server, the aggregator.
type Server struct {
	aggregator *aggregatorapiserver.APIAggregator
}

// building serializes New. k8s.io/apiserver registers its process-wide metrics while the first server is
// built, and a server built at the same time already sets them (flow control's gauges): a data race that
// tests building servers side by side met. A process that builds one server never waits.
var building sync.Mutex

// New builds the API server: the library's generic server with Skiff's scheme, registry, storage,
// authentication, authorization and admission.
func New(c Config) (*Server, error) {
	building.Lock()
	defer building.Unlock()
	cfg := genericapiserver.NewRecommendedConfig(Codecs)
	cfg.EffectiveVersion = newServedVersion()
	cfg.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
		return withStatusBodies(genericapiserver.DefaultBuildHandlerChain(h, c))
	}
	if c.MaxRequestsInFlight > 0 {
		cfg.MaxRequestsInFlight = c.MaxRequestsInFlight
	}
	if c.MaxMutatingRequestsInFlight > 0 {
		cfg.MaxMutatingRequestsInFlight = c.MaxMutatingRequestsInFlight
	}
	// Streams (exec, attach, port-forward, followed logs) are long-running as watches are: no request timeout
	// and no in-flight slot, as in kube-apiserver.
	cfg.LongRunningFunc = genericfilters.BasicLongRunningRequestCheck(sets.NewString("watch", "proxy"), sets.NewString("attach", "exec", "proxy", "log", "portforward"))
	// One set of OpenAPI definitions and one discovery manager for the three servers of the chain, as
	// kube-apiserver shares them: the aggregator merges what each server publishes.
	namer := openapinamer.NewDefinitionNamer(Scheme, apiextensionsapiserver.Scheme, aggregatorscheme.Scheme)
	definitions := withExtensionDefinitions(withMetricsDefinitions(openapi.GetOpenAPIDefinitions))
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(definitions, namer)
	cfg.OpenAPIConfig.Info.Title = "Skiff"
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(definitions, namer)
	cfg.OpenAPIV3Config.Info.Title = "Skiff"
	cfg.AggregatedDiscoveryGroupManager = aggregated.NewResourceManager("apis")

	serving, err := dynamiccertificates.NewStaticCertKeyContent("serving-cert", c.CertPEM, c.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	cfg.SecureServing = &genericapiserver.SecureServingInfo{Listener: c.Listener, Cert: serving}
	// The loopback client (used by the library's own controllers and by admission informers) reaches this
	// server under a name of its own, with a self-signed certificate and a per-process token.
	loopbackCert, loopbackKey, err := certutil.GenerateSelfSignedCertKey(genericapiserver.LoopbackClientServerNameOverride, nil, nil)
	if err != nil {
		return nil, err
	}
	loopbackSNI, err := dynamiccertificates.NewStaticSNICertKeyContent("loopback", loopbackCert, loopbackKey, genericapiserver.LoopbackClientServerNameOverride)
	if err != nil {
		return nil, err
	}
	cfg.SecureServing.SNICerts = append(cfg.SecureServing.SNICerts, loopbackSNI)
	if cfg.LoopbackClientConfig, err = cfg.SecureServing.NewLoopbackClientConfig(uuid.NewString(), loopbackCert); err != nil {
		return nil, err
	}
	// The server's own clients (its informers, apiextensions, the aggregator) would otherwise ask for gzip,
	// and every watch event they receive would be compressed and inflated again within this process.
	cfg.LoopbackClientConfig.DisableCompression = true
	// Without a client CA (some tests), no client certificate authenticates.
	clientCAVerify := func() (x509.VerifyOptions, bool) { return x509.VerifyOptions{}, false }
	if len(c.ClientCAPEM) > 0 {
		clientCA, err := dynamiccertificates.NewStaticCAContent("client-ca", c.ClientCAPEM)
		if err != nil {
			return nil, fmt.Errorf("client CA: %w", err)
		}
		cfg.SecureServing.ClientCA = clientCA
		clientCAVerify = clientCA.VerifyOptions
	}
	saTokens := auth.NewServiceAccountTokens(c.ServiceAccountKey)
	tokens := auth.TokenAuthenticator(c.AdminToken, c.JoinToken, saTokens)
	cfg.Authentication.Authenticator = auth.RequestAuthenticator(clientCAVerify, c.AdminToken, c.JoinToken, saTokens)

	client, err := kubernetes.NewForConfig(cfg.LoopbackClientConfig)
	if err != nil {
		return nil, err
	}
	// Admission, the authorizers and flow control read these caches. What they keep is the watch cache's own
	// copy of each object (or shares its memory, when the cache has moved on), not a second one: whole
	// objects then cost nothing, where a stripped copy would cost its own top-level struct.
	if c.Shared == nil {
		c.Shared = memshare.NewRegistry()
	}
	cfg.SharedInformerFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTransform(cachetransform.SharedWith(c.Shared)))
	// API Priority and Fairness, on by default as in kube-apiserver: each request is classified by the
	// FlowSchemas (kinds_flowcontrol.go keeps the bootstrap ones), waits in its priority level's fair queues
	// and is refused with 429 when they are full; exempt ones (system:masters, health checks) pass at once.
	// The two in-flight limits together are the concurrency the levels share, as kube-apiserver counts it.
	cfg.FlowControl = utilflowcontrol.New(cfg.SharedInformerFactory, client.FlowcontrolV1(), cfg.MaxRequestsInFlight+cfg.MaxMutatingRequestsInFlight)
	authz, err := auth.NewAuthorization(cfg.SharedInformerFactory)
	if err != nil {
		return nil, err
	}
	cfg.Authorization.Authorizer = authz.Authorizer
	cfg.RuleResolver = authz.Rules
	genericapiserver.AuthorizeClientBearerToken(cfg.LoopbackClientConfig, &cfg.Authentication, &cfg.Authorization)
	tolerationSeconds := int64(300)
	if c.DefaultTolerationSeconds != nil {
		tolerationSeconds = *c.DefaultTolerationSeconds
	}
	// One resolver finds webhooks' and extension servers' Services for the admission webhooks and the three
	// servers of the chain.
	services, err := newServiceResolver(cfg.LoopbackClientConfig, cfg.SharedInformerFactory)
	if err != nil {
		return nil, err
	}
	certs, err := certificateAdmission(cfg.Authorization.Authorizer)
	if err != nil {
		return nil, err
	}
	if cfg.AdmissionControl, err = admission.NewChain(cfg, admission.Config{Client: client, TolerationSeconds: tolerationSeconds,
		PodSecurity: c.PodSecurity, Certificates: certs, ServiceResolver: services}); err != nil {
		return nil, err
	}
	if c.Audit != nil {
		if err := setupAudit(&cfg.Config, c.Audit); err != nil {
			return nil, err
		}
	}
	cfg.RESTOptionsGetter = &restOptionsGetter{backend: c.Backend, transformers: c.Transformers, shared: c.Shared}
	if _, ok := c.Handlers["/metrics"]; ok {
		// The server serves /metrics itself, from the same legacy registry; the library registers its
		// request metrics (apiserver_request_total and the rest) only when it serves them, so they are
		// registered here.
		cfg.EnableMetrics = false
		apimetrics.Register()
	}
	cfg.AddReadyzChecks(c.ReadyzChecks...)

	// The chain, innermost first (package doc): the extensions server, the built-in kinds delegating to it,
	// the aggregator in front. Each works on a copy of the shared config, taken before any is completed.
	aggregatorConfig := *cfg
	ext, err := extensions.New(extensions.Config{Generic: cfg, Backend: c.Backend, Transformers: c.Transformers,
		ServiceResolver: services, AuthResolverWrapper: webhook.NewDefaultAuthenticationInfoResolverWrapper(nil, nil, cfg.LoopbackClientConfig, nil)},
		genericapiserver.NewEmptyDelegateWithCustomHandler(withPendingCustomResources(c.Backend, cfg.Serializer,
			notfoundhandler.New(cfg.Serializer, genericapifilters.NoMuxAndDiscoveryIncompleteKey))))
	if err != nil {
		return nil, err
	}
	generic, err := cfg.Complete().New("skiff-apiserver", ext.GenericAPIServer)
	if err != nil {
		return nil, err
	}
	if c.ServiceCIDR == "" {
		c.ServiceCIDR = DefaultServiceCIDR
	}
	_, cidr, err := net.ParseCIDR(c.ServiceCIDR)
	if err != nil || cidr.IP.To4() == nil {
		return nil, fmt.Errorf("service CIDR %q must be an IPv4 CIDR", c.ServiceCIDR)
	}
	if c.ClusterCIDR == "" {
		c.ClusterCIDR = DefaultClusterCIDR
	}
	_, clusterCIDR, err := net.ParseCIDR(c.ClusterCIDR)
	if err != nil || clusterCIDR.IP.To4() == nil {
		return nil, fmt.Errorf("cluster CIDR %q must be an IPv4 CIDR", c.ClusterCIDR)
	}
	getter := cfg.RESTOptionsGetter.(*restOptionsGetter)
	// A paramKind resolves to its resource through discovery, asked (of this server) at each check.
	resources, err := resolver.NewDiscoveryResourceResolver(client.Discovery())
	if err != nil {
		return nil, err
	}
	getter.eventTTL = c.EventTTL
	if err := installAPIs(generic, getter, cidr, clusterCIDR, c.LoadBalancerPools, saTokens, auth.WithAuthenticatedGroup(tokens), authz, c.AgentTransport, c.Metrics, resources, client.CoreV1().Namespaces()); err != nil {
		return nil, err
	}
	generic.AddPostStartHookOrDie("rbac/bootstrap-roles", auth.RBACPolicyHook(c.RBACPolicyReady))
	generic.AddPostStartHookOrDie("scheduling/bootstrap-system-priority-classes", systemPriorityClassesHook)
	generic.AddPostStartHookOrDie("priority-and-fairness-config-producer", flowControlBootstrapHook(cfg.SharedInformerFactory))
	generic.AddPostStartHookOrDie("start-kubernetes-service-cidr-controller", defaultServiceCIDRHook(cidr))
	trust, err := extensionAuthentication(c.ClientCAPEM, c.FrontProxyCAPEM, client)
	if err != nil {
		return nil, err
	}
	generic.AddPostStartHookOrDie("start-cluster-authentication-info-controller", trust)
	for path, h := range saTokens.IssuerDiscoveryHandlers() {
		generic.Handler.NonGoRestfulMux.Handle(path, h)
	}
	for path, h := range c.Handlers {
		if strings.HasSuffix(path, "/") {
			generic.Handler.NonGoRestfulMux.HandlePrefix(path, h)
		} else {
			generic.Handler.NonGoRestfulMux.Handle(path, h)
		}
	}
	agg, err := aggregator.New(aggregator.Config{Generic: &aggregatorConfig, Backend: c.Backend, Transformers: c.Transformers,
		ServiceResolver: services, CRDs: ext.Informers.Apiextensions().V1().CustomResourceDefinitions(),
		ProxyClientCertFile: c.FrontProxyClientCertFile, ProxyClientKeyFile: c.FrontProxyClientKeyFile,
		Priorities: apiServicePriorities()}, generic)
	if err != nil {
		return nil, err
	}
	// Open watches (the server's own informers among them) would hold a graceful shutdown for the library's
	// default minute; clients reconnect to another peer anyway.
	agg.GenericAPIServer.ShutdownTimeout = 3 * time.Second
	return &Server{aggregator: agg}, nil
}

// installAPIs installs every kind of the registry table, grouped by API group.
func installAPIs(s *genericapiserver.GenericAPIServer, getter *restOptionsGetter, serviceCIDR, clusterCIDR *net.IPNet, lbPools lbpool.Pools, saTokens *auth.ServiceAccountTokens,
	tokens authenticator.Token, authz *auth.Authorization, agentTransport http.RoundTripper, metrics MetricsSource, resources resolver.ResourceResolver,
	namespaces corev1client.NamespaceInterface) error {
	groups := map[string]*genericapiserver.APIGroupInfo{}
	var order []string
	stores := map[string]*resource{}
	deps := serverDeps{authorizer: authz.Authorizer, resources: resources, namespaces: namespaces,
		stored: func(ctx context.Context, resource, name string) (runtime.Object, error) {
			return stores[resource].Get(ctx, name, &metav1.GetOptions{})
		}}
	for _, k := range kinds {
		if k.kubeFor != nil {
			perServer := *k
			perServer.kube = k.kubeFor(deps)
			k = &perServer
		}
		info, ok := groups[k.gv.Group]
		if !ok {
			g := genericapiserver.NewDefaultAPIGroupInfo(k.gv.Group, Scheme, ParameterCodec, Codecs)
			info = &g
			groups[k.gv.Group] = info
			order = append(order, k.gv.Group)
		}
		paths, err := k.restStorage(getter)
		if err != nil {
			return err
		}
		// Each version the kind is served in has the same storages; the library converts.
		for _, gv := range append([]schema.GroupVersion{k.gv}, k.alsoServedIn...) {
			if info.VersionedResourcesStorageMap[gv.Version] == nil {
				info.VersionedResourcesStorageMap[gv.Version] = map[string]rest.Storage{}
			}
			for path, st := range paths {
				info.VersionedResourcesStorageMap[gv.Version][path] = st
			}
		}
		if r, ok := paths[k.resource].(*resource); ok {
			stores[k.resource] = r
		}
	}
	// Services allocate their ClusterIPs as IPAddress objects.
	groups[""].VersionedResourcesStorageMap["v1"]["services"] = &serviceREST{
		resource: stores["services"], ips: stores["ipaddresses"].Store, cidrs: stores["servicecidrs"].Store, cidr: serviceCIDR,
		nodePorts: raftstore.NewClaims(getter.backend, nodePortPrefix), lbPools: lbPools,
	}
	// Nodes get their pod CIDRs at creation.
	nodes := &nodeREST{resource: stores["nodes"], cidr: clusterCIDR, claims: raftstore.NewClaims(getter.backend, podCIDRPrefix)}
	nodes.Store.AfterDelete = nodes.releaseAfterDelete
	groups[""].VersionedResourcesStorageMap["v1"]["nodes"] = nodes
	// Evictions spend the PodDisruptionBudgets of the pods they delete.
	if eviction, ok := groups[""].VersionedResourcesStorageMap["v1"]["pods/eviction"].(*evictionREST); ok {
		policy := groups[policyv1.GroupName].VersionedResourcesStorageMap["v1"]
		eviction.budgets = &budgetStores{main: stores["poddisruptionbudgets"].Store, status: policy["poddisruptionbudgets/status"].(rest.Updater)}
	}
	// Service account tokens look up the account and the objects they are bound to.
	for kind, resource := range map[string]string{"ServiceAccount": "serviceaccounts", "Pod": "pods", "Secret": "secrets", "Node": "nodes"} {
		saTokens.SetStore(kind, stores[resource].Store)
	}
	groups[""].VersionedResourcesStorageMap["v1"]["serviceaccounts/token"] = saTokens.TokenRequestStorage()
	agents := &agents{pods: stores["pods"].Store, nodes: stores["nodes"].Store, transport: agentTransport, authorizer: authz.Authorizer}
	for path, st := range podStreamStorage(agents) {
		groups[""].VersionedResourcesStorageMap["v1"][path] = st
	}
	for path, st := range proxyStorage(agents, stores["services"].Store, stores["endpoints"].Store) {
		groups[""].VersionedResourcesStorageMap["v1"][path] = st
	}
	// RBAC writes are checked for escalation: no one grants what they do not hold.
	for path, st := range wrapRBACEscalation(stores, authz.Authorizer, newRBACStoreRuleResolver(stores)) {
		groups[rbacv1.GroupName].VersionedResourcesStorageMap["v1"][path] = st
	}
	// authentication.k8s.io and authorization.k8s.io hold no stored kind, only reviews.
	authn := genericapiserver.NewDefaultAPIGroupInfo(authenticationv1.GroupName, Scheme, ParameterCodec, Codecs)
	authn.VersionedResourcesStorageMap["v1"] = map[string]rest.Storage{"selfsubjectreviews": selfSubjectReviewREST{}, "tokenreviews": &tokenReviewREST{tokens: tokens}}
	groups[authenticationv1.GroupName] = &authn
	reviews := authorizationAPIGroup(authz.Authorizer, authz.Rules)
	groups[authorizationv1.GroupName] = &reviews
	order = append(order, authenticationv1.GroupName, authorizationv1.GroupName)
	if metrics != nil {
		groups[metricsv1beta1.GroupName] = metricsAPIGroup(metrics, stores["pods"], stores["nodes"])
		order = append(order, metricsv1beta1.GroupName)
	}
	for _, group := range order {
		info := groups[group]
		if group == "" {
			if err := s.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, info); err != nil {
				return fmt.Errorf("installing the core API: %w", err)
			}
			continue
		}
		if err := s.InstallAPIGroup(info); err != nil {
			return fmt.Errorf("installing %s: %w", group, err)
		}
	}
	return nil
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	prepared, err := s.aggregator.PrepareRun()
	if err != nil {
		return err
	}
	return prepared.Run(ctx)
}
