package apiserver

import (
	"context"
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	storagemigrationv1 "k8s.io/api/storagemigration/v1"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	eventsv1internal "k8s.io/kubernetes/pkg/apis/events/v1"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// kind describes one served resource, once: everything the registry, the strategy, field selectors and
// tables need.
type kind struct {
	gv          schema.GroupVersion
	resource    string // plural, lower case
	singular    string
	namespaced  bool
	newFunc     func() runtime.Object
	newListFunc func() runtime.Object
	shortNames  []string
	categories  []string
	hasStatus   bool // a status subresource that alone may change .status
	// statusKeepsMeta are the metadata fields (keys of statusMetaFields) that the status subresource takes
	// from the stored object, as the kind's status strategy in kube-apiserver does; it keeps other metadata
	// changes.
	statusKeepsMeta []string
	// statusOnCreate keeps the status a create sends, as Kubernetes does for Nodes: a node agent registers
	// its Node with capacity and conditions in one request.
	statusOnCreate bool

	defaults      func(obj runtime.Object)      // applied on create and update
	prepareCreate func(obj runtime.Object)      // after defaults, on create only
	prepareUpdate func(obj, old runtime.Object) // after defaults, on update only
	validate      func(obj runtime.Object) field.ErrorList
	// validateName checks metadata.name; a DNS subdomain when nil (RBAC names may hold colons).
	validateName   apimachineryvalidation.ValidateNameFunc
	validateCreate func(obj runtime.Object) field.ErrorList // on create only
	validateUpdate func(obj, old runtime.Object) field.ErrorList
	fields         func(obj runtime.Object) fields.Set // field-selector attributes beyond metadata.name/namespace
	fieldNames     []string                            // the names fields returns, for label conversion
	// fieldLabels, when set, registers the kind's field label conversion in place of one from fieldNames: a
	// kind whose selectors name fields differently from the attributes fields returns (events.k8s.io).
	fieldLabels func(*runtime.Scheme) error
	// columns are the table's columns. When nil, kube's printers make the table of a kind that runs kube's
	// strategies (kubetables.go), and NAME and AGE that of any other.
	columns    []column
	ttlSeconds uint64 // objects expire (events)
	// returnDeleted answers a delete with the deleted object rather than a Status, as kube's store of the kind
	// does (ResourceClaims).
	returnDeleted bool
	// gracefulDelete decides the grace period of a delete (pods); nil deletes at once.
	gracefulDelete func(obj runtime.Object, options *metav1.DeleteOptions) bool
	subresources   []subresource // beyond status
	// storageGV stores the kind as another group's type (events.k8s.io Events are stored as core Events).
	storageGV *schema.GroupVersion
	// alsoServedIn are further versions of the group that serve the same objects from the same store, the
	// scheme converting them to and from gv's type, the group's internal one (HorizontalPodAutoscalers in
	// autoscaling/v1 as well as v2). gv is the preferred version and the stored one.
	alsoServedIn []schema.GroupVersion
	// kube runs Kubernetes' own registry strategies, on its internal type, in place of this table's rules;
	// its update-only subresources (status among them) are served too.
	kube *kubeStrategies
	// kubeFor is kube for strategies that need the server they run in (an authorizer, discovery).
	kubeFor func(serverDeps) *kubeStrategies
}

func obj[T any, PT interface {
	*T
	runtime.Object
}]() func() runtime.Object {
	return func() runtime.Object { return PT(new(T)) }
}

// kinds is the registry table.
var kinds = []*kind{
	// core/v1
	{gv: corev1.SchemeGroupVersion, resource: "namespaces", singular: "namespace", newFunc: obj[corev1.Namespace](), newListFunc: obj[corev1.NamespaceList](),
		shortNames: []string{"ns"}, hasStatus: true, defaults: defaultNamespace, fields: namespaceFields, fieldNames: []string{"status.phase"},
		subresources: []subresource{{"finalize", func(s *genericregistry.Store) rest.Storage { return &finalizeREST{store: s} }}},
		columns:      []column{nameColumn, {name: "Status", typ: "string", value: namespaceStatus}, ageColumn}},
	{gv: corev1.SchemeGroupVersion, resource: "pods", singular: "pod", namespaced: true, newFunc: obj[corev1.Pod](), newListFunc: obj[corev1.PodList](),
		shortNames: []string{"po"}, categories: []string{"all"}, hasStatus: true, statusKeepsMeta: []string{"deletionTimestamp", "ownerReferences"}, defaults: defaultPod, prepareCreate: preparePodCreate, prepareUpdate: preparePodUpdate,
		validate: validatePod, validateCreate: validatePodCreate, validateUpdate: validatePodUpdate, fields: podFields, gracefulDelete: podGracefulDelete, subresources: podSubresources,
		fieldNames: []string{"spec.nodeName", "status.phase", "spec.schedulerName", "spec.restartPolicy", "spec.serviceAccountName", "status.podIP", "status.nominatedNodeName"},
		columns:    podColumns},
	{gv: corev1.SchemeGroupVersion, resource: "services", singular: "service", namespaced: true, newFunc: obj[corev1.Service](), newListFunc: obj[corev1.ServiceList](),
		shortNames: []string{"svc"}, categories: []string{"all"}, hasStatus: true, defaults: defaultService, columns: serviceColumns,
		prepareUpdate: prepareServiceUpdate, validate: validateService, validateUpdate: validateServiceUpdate},
	{gv: corev1.SchemeGroupVersion, resource: "endpoints", singular: "endpoints", namespaced: true, newFunc: obj[corev1.Endpoints](), newListFunc: obj[corev1.EndpointsList](),
		shortNames: []string{"ep"}, columns: endpointsColumns},
	{gv: corev1.SchemeGroupVersion, resource: "configmaps", singular: "configmap", namespaced: true, newFunc: obj[corev1.ConfigMap](), newListFunc: obj[corev1.ConfigMapList](),
		shortNames: []string{"cm"}, kube: configMapStrategies, columns: []column{nameColumn, {name: "Data", typ: "integer", value: configMapData}, ageColumn}},
	{gv: corev1.SchemeGroupVersion, resource: "secrets", singular: "secret", namespaced: true, newFunc: obj[corev1.Secret](), newListFunc: obj[corev1.SecretList](),
		defaults: defaultSecret, kube: secretStrategies, fields: secretFields, fieldNames: []string{"type"},
		columns: []column{nameColumn, {name: "Type", typ: "string", value: secretType}, {name: "Data", typ: "integer", value: secretData}, ageColumn}},
	{gv: corev1.SchemeGroupVersion, resource: "podtemplates", singular: "podtemplate", namespaced: true, newFunc: obj[corev1.PodTemplate](), newListFunc: obj[corev1.PodTemplateList](),
		kube: podTemplateStrategies, columns: podTemplateColumns},
	{gv: corev1.SchemeGroupVersion, resource: "replicationcontrollers", singular: "replicationcontroller", namespaced: true,
		newFunc: obj[corev1.ReplicationController](), newListFunc: obj[corev1.ReplicationControllerList](),
		shortNames: []string{"rc"}, categories: []string{"all"}, hasStatus: true, kube: replicationControllerStrategies,
		fields: replicationControllerFields, fieldNames: []string{"status.replicas"}, subresources: scaleSubresource(replicationControllerScale)},
	{gv: corev1.SchemeGroupVersion, resource: "serviceaccounts", singular: "serviceaccount", namespaced: true, newFunc: obj[corev1.ServiceAccount](), newListFunc: obj[corev1.ServiceAccountList](),
		shortNames: []string{"sa"}},
	{gv: corev1.SchemeGroupVersion, resource: "events", singular: "event", namespaced: true, newFunc: obj[corev1.Event](), newListFunc: obj[corev1.EventList](),
		shortNames: []string{"ev"}, fields: eventFields, ttlSeconds: 3600,
		fieldNames: []string{"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
			"involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"},
		columns: eventColumns},
	{gv: corev1.SchemeGroupVersion, resource: "nodes", singular: "node", newFunc: obj[corev1.Node](), newListFunc: obj[corev1.NodeList](),
		shortNames: []string{"no"}, hasStatus: true, statusOnCreate: true, validateUpdate: validateNodeUpdate, fields: nodeFields, fieldNames: []string{"spec.unschedulable"}, columns: nodeColumns},
	{gv: corev1.SchemeGroupVersion, resource: "limitranges", singular: "limitrange", namespaced: true, newFunc: obj[corev1.LimitRange](), newListFunc: obj[corev1.LimitRangeList](),
		shortNames: []string{"limits"}, kube: limitRangeStrategies},
	{gv: corev1.SchemeGroupVersion, resource: "resourcequotas", singular: "resourcequota", namespaced: true, newFunc: obj[corev1.ResourceQuota](), newListFunc: obj[corev1.ResourceQuotaList](),
		shortNames: []string{"quota"}, hasStatus: true, columns: resourceQuotaColumns},
	// Volumes and claims: Kubernetes' own strategies and validation (kinds_storage.go).
	{gv: corev1.SchemeGroupVersion, resource: "persistentvolumeclaims", singular: "persistentvolumeclaim", namespaced: true, newFunc: obj[corev1.PersistentVolumeClaim](), newListFunc: obj[corev1.PersistentVolumeClaimList](),
		shortNames: []string{"pvc"}, hasStatus: true, kube: persistentVolumeClaimStrategies, columns: persistentVolumeClaimColumns},
	{gv: corev1.SchemeGroupVersion, resource: "persistentvolumes", singular: "persistentvolume", newFunc: obj[corev1.PersistentVolume](), newListFunc: obj[corev1.PersistentVolumeList](),
		shortNames: []string{"pv"}, hasStatus: true, kube: persistentVolumeStrategies, columns: persistentVolumeColumns},

	// apps/v1
	{gv: appsv1.SchemeGroupVersion, resource: "deployments", singular: "deployment", namespaced: true, newFunc: obj[appsv1.Deployment](), newListFunc: obj[appsv1.DeploymentList](),
		shortNames: []string{"deploy"}, categories: []string{"all"}, hasStatus: true, statusKeepsMeta: []string{"labels"}, defaults: defaultDeployment, validate: validateDeployment, validateUpdate: validateSelectorUnchanged, columns: deploymentColumns,
		subresources: scaleSubresource(deploymentScale)},
	{gv: appsv1.SchemeGroupVersion, resource: "replicasets", singular: "replicaset", namespaced: true, newFunc: obj[appsv1.ReplicaSet](), newListFunc: obj[appsv1.ReplicaSetList](),
		shortNames: []string{"rs"}, categories: []string{"all"}, hasStatus: true, defaults: defaultReplicaSet, validate: validateReplicaSet, validateUpdate: validateSelectorUnchanged, columns: replicaSetColumns,
		subresources: scaleSubresource(replicaSetScale)},
	// StatefulSets: Kubernetes' own defaults, strategies and validation (statefulsets.go).
	{gv: appsv1.SchemeGroupVersion, resource: "statefulsets", singular: "statefulset", namespaced: true, newFunc: obj[appsv1.StatefulSet](), newListFunc: obj[appsv1.StatefulSetList](),
		shortNames: []string{"sts"}, categories: []string{"all"}, hasStatus: true, kube: statefulSetStrategies, columns: statefulSetColumns,
		subresources: scaleSubresource(statefulSetScale)},
	// DaemonSets and ControllerRevisions: Kubernetes' own defaults, strategies and validation (daemonsets.go).
	{gv: appsv1.SchemeGroupVersion, resource: "daemonsets", singular: "daemonset", namespaced: true, newFunc: obj[appsv1.DaemonSet](), newListFunc: obj[appsv1.DaemonSetList](),
		shortNames: []string{"ds"}, categories: []string{"all"}, hasStatus: true, kube: daemonSetStrategies, columns: daemonSetColumns},
	{gv: appsv1.SchemeGroupVersion, resource: "controllerrevisions", singular: "controllerrevision", namespaced: true, newFunc: obj[appsv1.ControllerRevision](), newListFunc: obj[appsv1.ControllerRevisionList](),
		kube: controllerRevisionStrategies, columns: controllerRevisionColumns},

	// batch/v1: Kubernetes' own defaults, strategies and validation (kinds_batch.go).
	{gv: batchv1.SchemeGroupVersion, resource: "jobs", singular: "job", namespaced: true, newFunc: obj[batchv1.Job](), newListFunc: obj[batchv1.JobList](),
		categories: []string{"all"}, hasStatus: true, kube: jobStrategies, fields: jobFields, fieldNames: []string{"status.successful"}, columns: jobColumns},
	{gv: batchv1.SchemeGroupVersion, resource: "cronjobs", singular: "cronjob", namespaced: true, newFunc: obj[batchv1.CronJob](), newListFunc: obj[batchv1.CronJobList](),
		shortNames: []string{"cj"}, categories: []string{"all"}, hasStatus: true, kube: cronJobStrategies, columns: cronJobColumns},

	// autoscaling/v2, and v1 converted from it: Kubernetes' own conversions, strategies and validation
	// (kinds_autoscaling.go); kube's controller keeps their status and scales their targets.
	{gv: autoscalingv2.SchemeGroupVersion, alsoServedIn: []schema.GroupVersion{autoscalingv1.SchemeGroupVersion},
		resource: "horizontalpodautoscalers", singular: "horizontalpodautoscaler", namespaced: true,
		newFunc: obj[autoscalingv2.HorizontalPodAutoscaler](), newListFunc: obj[autoscalingv2.HorizontalPodAutoscalerList](),
		shortNames: []string{"hpa"}, categories: []string{"all"}, hasStatus: true, kube: horizontalPodAutoscalerStrategies},

	// policy/v1: Kubernetes' own strategies and validation (kinds_policy.go); evictions honour them (eviction.go).
	{gv: policyv1.SchemeGroupVersion, resource: "poddisruptionbudgets", singular: "poddisruptionbudget", namespaced: true,
		newFunc: obj[policyv1.PodDisruptionBudget](), newListFunc: obj[policyv1.PodDisruptionBudgetList](),
		shortNames: []string{"pdb"}, hasStatus: true, kube: podDisruptionBudgetStrategies, columns: podDisruptionBudgetColumns},

	// storage.k8s.io/v1: Kubernetes' own strategies and validation (kinds_storage.go).
	{gv: storagev1.SchemeGroupVersion, resource: "storageclasses", singular: "storageclass", newFunc: obj[storagev1.StorageClass](), newListFunc: obj[storagev1.StorageClassList](),
		shortNames: []string{"sc"}, kube: storageClassStrategies, columns: storageClassColumns},
	{gv: storagev1.SchemeGroupVersion, resource: "csidrivers", singular: "csidriver", newFunc: obj[storagev1.CSIDriver](), newListFunc: obj[storagev1.CSIDriverList](),
		kube: csiDriverStrategies},
	{gv: storagev1.SchemeGroupVersion, resource: "csinodes", singular: "csinode", newFunc: obj[storagev1.CSINode](), newListFunc: obj[storagev1.CSINodeList](),
		kube: csiNodeStrategies},
	{gv: storagev1.SchemeGroupVersion, resource: "csistoragecapacities", singular: "csistoragecapacity", namespaced: true,
		newFunc: obj[storagev1.CSIStorageCapacity](), newListFunc: obj[storagev1.CSIStorageCapacityList](), kube: csiStorageCapacityStrategies},
	{gv: storagev1.SchemeGroupVersion, resource: "volumeattachments", singular: "volumeattachment", newFunc: obj[storagev1.VolumeAttachment](), newListFunc: obj[storagev1.VolumeAttachmentList](),
		kube: volumeAttachmentStrategies},
	{gv: storagev1.SchemeGroupVersion, resource: "volumeattributesclasses", singular: "volumeattributesclass", newFunc: obj[storagev1.VolumeAttributesClass](), newListFunc: obj[storagev1.VolumeAttributesClassList](),
		shortNames: []string{"vac"}, kube: volumeAttributesClassStrategies},

	// discovery.k8s.io/v1
	{gv: discoveryv1.SchemeGroupVersion, resource: "endpointslices", singular: "endpointslice", namespaced: true, newFunc: obj[discoveryv1.EndpointSlice](), newListFunc: obj[discoveryv1.EndpointSliceList](), columns: endpointSliceColumns},

	// events.k8s.io/v1: the core Events, in the newer shape, from the same storage.
	{gv: eventsv1.SchemeGroupVersion, resource: "events", singular: "event", namespaced: true, newFunc: obj[eventsv1.Event](), newListFunc: obj[eventsv1.EventList](),
		shortNames: []string{"ev"}, ttlSeconds: 3600, storageGV: &corev1.SchemeGroupVersion,
		fields: eventsV1Fields, fieldLabels: eventsv1internal.AddFieldLabelConversionsForEvent},

	// coordination.k8s.io/v1
	{gv: coordinationv1.SchemeGroupVersion, resource: "leases", singular: "lease", namespaced: true, newFunc: obj[coordinationv1.Lease](), newListFunc: obj[coordinationv1.LeaseList](),
		columns: []column{nameColumn, {name: "Holder", typ: "string", value: leaseHolder}, ageColumn}},

	// rbac.authorization.k8s.io/v1: validated by Kubernetes' own code (rbac.go), enforced by its authorizer
	// (package apiserver/auth).
	{gv: rbacv1.SchemeGroupVersion, resource: "roles", singular: "role", namespaced: true, newFunc: obj[rbacv1.Role](), newListFunc: obj[rbacv1.RoleList](),
		validateName: rbacNameFunc, validateCreate: validateRole, validateUpdate: validateRoleUpdate},
	{gv: rbacv1.SchemeGroupVersion, resource: "rolebindings", singular: "rolebinding", namespaced: true, newFunc: obj[rbacv1.RoleBinding](), newListFunc: obj[rbacv1.RoleBindingList](),
		validateName: rbacNameFunc, defaults: defaultRoleBinding, validateCreate: validateRoleBinding, validateUpdate: validateRoleBindingUpdate},
	{gv: rbacv1.SchemeGroupVersion, resource: "clusterroles", singular: "clusterrole", newFunc: obj[rbacv1.ClusterRole](), newListFunc: obj[rbacv1.ClusterRoleList](),
		validateName: rbacNameFunc, validateCreate: validateClusterRole, validateUpdate: validateClusterRoleUpdate},
	{gv: rbacv1.SchemeGroupVersion, resource: "clusterrolebindings", singular: "clusterrolebinding", newFunc: obj[rbacv1.ClusterRoleBinding](), newListFunc: obj[rbacv1.ClusterRoleBindingList](),
		validateName: rbacNameFunc, defaults: defaultClusterRoleBinding, validateCreate: validateClusterRoleBinding, validateUpdate: validateClusterRoleBindingUpdate},

	// certificates.k8s.io/v1: Kubernetes' own strategies, admission and printers (certificates.go).
	{gv: certificatesv1.SchemeGroupVersion, resource: "certificatesigningrequests", singular: "certificatesigningrequest",
		newFunc: obj[certificatesv1.CertificateSigningRequest](), newListFunc: obj[certificatesv1.CertificateSigningRequestList](),
		shortNames: []string{"csr"}, hasStatus: true, kube: csrStrategies, fields: csrFields, fieldNames: []string{"spec.signerName"}, columns: csrColumns},
	{gv: certificatesv1.SchemeGroupVersion, resource: "clustertrustbundles", singular: "clustertrustbundle",
		newFunc: obj[certificatesv1.ClusterTrustBundle](), newListFunc: obj[certificatesv1.ClusterTrustBundleList](),
		kube: clusterTrustBundleStrategies, fields: clusterTrustBundleFields, fieldNames: []string{"spec.signerName"}},
	{gv: certificatesv1.SchemeGroupVersion, resource: "podcertificaterequests", singular: "podcertificaterequest", namespaced: true,
		newFunc: obj[certificatesv1.PodCertificateRequest](), newListFunc: obj[certificatesv1.PodCertificateRequestList](),
		hasStatus: true, kubeFor: podCertificateRequestStrategies, fields: podCertificateRequestFields, fieldNames: podCertificateRequestFieldNames},

	// scheduling.k8s.io/v1
	{gv: schedulingv1.SchemeGroupVersion, resource: "priorityclasses", singular: "priorityclass", newFunc: obj[schedulingv1.PriorityClass](), newListFunc: obj[schedulingv1.PriorityClassList](),
		shortNames: []string{"pc"}, kube: priorityClassStrategies},

	// admissionregistration.k8s.io/v1: Kubernetes' own strategies and validation (kinds_admissionregistration.go),
	// enforced by the library's admission plugins (package apiserver/admission, policy.go).
	{gv: admissionregistrationv1.SchemeGroupVersion, resource: "validatingwebhookconfigurations", singular: "validatingwebhookconfiguration",
		newFunc: obj[admissionregistrationv1.ValidatingWebhookConfiguration](), newListFunc: obj[admissionregistrationv1.ValidatingWebhookConfigurationList](),
		kube: validatingWebhookConfigurationStrategies},
	{gv: admissionregistrationv1.SchemeGroupVersion, resource: "mutatingwebhookconfigurations", singular: "mutatingwebhookconfiguration",
		newFunc: obj[admissionregistrationv1.MutatingWebhookConfiguration](), newListFunc: obj[admissionregistrationv1.MutatingWebhookConfigurationList](),
		kube: mutatingWebhookConfigurationStrategies},
	{gv: admissionregistrationv1.SchemeGroupVersion, resource: "validatingadmissionpolicies", singular: "validatingadmissionpolicy",
		newFunc: obj[admissionregistrationv1.ValidatingAdmissionPolicy](), newListFunc: obj[admissionregistrationv1.ValidatingAdmissionPolicyList](),
		hasStatus: true, kubeFor: admissionPolicyStrategies},
	{gv: admissionregistrationv1.SchemeGroupVersion, resource: "validatingadmissionpolicybindings", singular: "validatingadmissionpolicybinding",
		newFunc: obj[admissionregistrationv1.ValidatingAdmissionPolicyBinding](), newListFunc: obj[admissionregistrationv1.ValidatingAdmissionPolicyBindingList](),
		kubeFor: admissionPolicyBindingStrategies},
	{gv: admissionregistrationv1.SchemeGroupVersion, resource: "mutatingadmissionpolicies", singular: "mutatingadmissionpolicy",
		newFunc: obj[admissionregistrationv1.MutatingAdmissionPolicy](), newListFunc: obj[admissionregistrationv1.MutatingAdmissionPolicyList](),
		kubeFor: mutatingPolicyStrategies},
	{gv: admissionregistrationv1.SchemeGroupVersion, resource: "mutatingadmissionpolicybindings", singular: "mutatingadmissionpolicybinding",
		newFunc: obj[admissionregistrationv1.MutatingAdmissionPolicyBinding](), newListFunc: obj[admissionregistrationv1.MutatingAdmissionPolicyBindingList](),
		kubeFor: mutatingPolicyBindingStrategies},

	// storagemigration.k8s.io/v1 (kinds_storagemigration.go)
	{gv: storagemigrationv1.SchemeGroupVersion, resource: "storageversionmigrations", singular: "storageversionmigration",
		newFunc: obj[storagemigrationv1.StorageVersionMigration](), newListFunc: obj[storagemigrationv1.StorageVersionMigrationList](),
		hasStatus: true, kube: storageVersionMigrationStrategies},

	// flowcontrol.apiserver.k8s.io/v1: API Priority and Fairness' configuration (kinds_flowcontrol.go)
	{gv: flowcontrolv1.SchemeGroupVersion, resource: "flowschemas", singular: "flowschema",
		newFunc: obj[flowcontrolv1.FlowSchema](), newListFunc: obj[flowcontrolv1.FlowSchemaList](),
		hasStatus: true, kube: flowSchemaStrategies},
	{gv: flowcontrolv1.SchemeGroupVersion, resource: "prioritylevelconfigurations", singular: "prioritylevelconfiguration",
		newFunc: obj[flowcontrolv1.PriorityLevelConfiguration](), newListFunc: obj[flowcontrolv1.PriorityLevelConfigurationList](),
		hasStatus: true, kube: priorityLevelStrategies},

	// resource.k8s.io/v1: Dynamic Resource Allocation's kinds with kube's strategies and printers (kinds_resource.go)
	{gv: resourcev1.SchemeGroupVersion, resource: "deviceclasses", singular: "deviceclass",
		newFunc: obj[resourcev1.DeviceClass](), newListFunc: obj[resourcev1.DeviceClassList](), kube: deviceClassStrategies},
	{gv: resourcev1.SchemeGroupVersion, resource: "devicetaintrules", singular: "devicetaintrule",
		newFunc: obj[resourcev1.DeviceTaintRule](), newListFunc: obj[resourcev1.DeviceTaintRuleList](),
		hasStatus: true, kube: deviceTaintRuleStrategies},
	{gv: resourcev1.SchemeGroupVersion, resource: "resourceclaims", singular: "resourceclaim", namespaced: true,
		newFunc: obj[resourcev1.ResourceClaim](), newListFunc: obj[resourcev1.ResourceClaimList](),
		hasStatus: true, kubeFor: resourceClaimStrategies, returnDeleted: true},
	{gv: resourcev1.SchemeGroupVersion, resource: "resourceclaimtemplates", singular: "resourceclaimtemplate", namespaced: true,
		newFunc: obj[resourcev1.ResourceClaimTemplate](), newListFunc: obj[resourcev1.ResourceClaimTemplateList](),
		kubeFor: resourceClaimTemplateStrategies},
	{gv: resourcev1.SchemeGroupVersion, resource: "resourceslices", singular: "resourceslice",
		newFunc: obj[resourcev1.ResourceSlice](), newListFunc: obj[resourcev1.ResourceSliceList](),
		kube: resourceSliceStrategies, fields: resourceSliceFields, fieldNames: resourceSliceFieldNames},

	// networking.k8s.io/v1; Ingresses, IngressClasses and NetworkPolicies with kube's strategies (kinds_networking.go)
	{gv: networkingv1.SchemeGroupVersion, resource: "servicecidrs", singular: "servicecidr", newFunc: obj[networkingv1.ServiceCIDR](), newListFunc: obj[networkingv1.ServiceCIDRList](),
		hasStatus: true, kube: serviceCIDRStrategies},
	{gv: networkingv1.SchemeGroupVersion, resource: "ipaddresses", singular: "ipaddress", newFunc: obj[networkingv1.IPAddress](), newListFunc: obj[networkingv1.IPAddressList](),
		shortNames: []string{"ip"}, kube: ipAddressStrategies},
	{gv: networkingv1.SchemeGroupVersion, resource: "ingresses", singular: "ingress", namespaced: true, newFunc: obj[networkingv1.Ingress](), newListFunc: obj[networkingv1.IngressList](),
		shortNames: []string{"ing"}, kube: ingressStrategies},
	{gv: networkingv1.SchemeGroupVersion, resource: "ingressclasses", singular: "ingressclass", newFunc: obj[networkingv1.IngressClass](), newListFunc: obj[networkingv1.IngressClassList](),
		kube: ingressClassStrategies},
	{gv: networkingv1.SchemeGroupVersion, resource: "networkpolicies", singular: "networkpolicy", namespaced: true, newFunc: obj[networkingv1.NetworkPolicy](), newListFunc: obj[networkingv1.NetworkPolicyList](),
		shortNames: []string{"netpol"}, kube: networkPolicyStrategies},

	// node.k8s.io/v1 (kinds_networking.go)
	{gv: nodev1.SchemeGroupVersion, resource: "runtimeclasses", singular: "runtimeclass", newFunc: obj[nodev1.RuntimeClass](), newListFunc: obj[nodev1.RuntimeClassList](),
		kube: runtimeClassStrategies},
}

// registerFieldLabels tells the scheme which field selectors each kind accepts; any other is refused with 400.
func registerFieldLabels() {
	for _, k := range kinds {
		k := k
		if k.fieldLabels != nil {
			utilruntime.Must(k.fieldLabels(Scheme))
			continue
		}
		allowed := map[string]bool{"metadata.name": true}
		if k.namespaced {
			allowed["metadata.namespace"] = true
		}
		for _, f := range k.fieldNames {
			allowed[f] = true
		}
		for _, gv := range append([]schema.GroupVersion{k.gv}, k.alsoServedIn...) {
			utilruntime.Must(Scheme.AddFieldLabelConversionFunc(gv.WithKind(kindName(k)), func(label, value string) (string, string, error) {
				if allowed[label] {
					return label, value, nil
				}
				return "", "", fmt.Errorf("field label not supported: %s", label)
			}))
		}
	}
}

// kindName is the Kind of a resource's objects, from the scheme.
func kindName(k *kind) string {
	gvks, _, err := Scheme.ObjectKinds(k.newFunc())
	if err != nil {
		panic(err)
	}
	for _, gvk := range gvks {
		if gvk.GroupVersion() == k.gv {
			return gvk.Kind
		}
	}
	return gvks[0].Kind
}

// restStorage builds the registry store of a kind and of its subresources, keyed by their path under the
// resource ("pods", "pods/status", "pods/binding").
func (k *kind) restStorage(getter generic.RESTOptionsGetter) (map[string]rest.Storage, error) {
	st := newStrategy(k)
	columns := k.columns
	if columns == nil {
		columns = []column{nameColumn, ageColumn}
	}
	gr := schema.GroupResource{Group: k.gv.Group, Resource: k.resource}
	store := &genericregistry.Store{
		NewFunc:                   k.newFunc,
		NewListFunc:               k.newListFunc,
		DefaultQualifiedResource:  gr,
		SingularQualifiedResource: schema.GroupResource{Group: k.gv.Group, Resource: k.singular},
		PredicateFunc:             k.predicate,
		CreateStrategy:            st,
		UpdateStrategy:            st,
		DeleteStrategy:            st,
		ResetFieldsStrategy:       st,
		TableConvertor:            tableConvertor{columns: columns},
		ReturnDeletedObject:       k.returnDeleted,
	}
	if k.columns == nil && k.kube != nil {
		store.TableConvertor = kubeTableConvertor{internal: k.kube.internal}
	}
	if k.ttlSeconds > 0 {
		ttl := k.ttlSeconds
		if g, ok := getter.(*restOptionsGetter); ok && g.eventTTL > 0 {
			ttl = uint64(g.eventTTL / time.Second)
		}
		store.TTLFunc = func(runtime.Object, uint64, bool) (uint64, error) { return ttl, nil }
	}
	if k.kube != nil {
		main := k.kube.adapt(st, k.kube.main)
		store.CreateStrategy, store.UpdateStrategy, store.DeleteStrategy, store.ResetFieldsStrategy = main, main, main, main
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: getter, AttrFunc: k.attrFunc}); err != nil {
		return nil, fmt.Errorf("%s: %w", gr, err)
	}
	var main rest.Storage = &resource{Store: store, k: k}
	if k.resource == "namespaces" {
		main = &namespaceREST{&resource{Store: store, k: k}}
		// A terminating namespace is removed by its last finalizer, never by an update (of its labels, of
		// its status conditions) while spec.finalizers holds it; the status store below copies this.
		store.ShouldDeleteDuringUpdate = shouldDeleteNamespaceDuringUpdate
	}
	out := map[string]rest.Storage{k.resource: main}
	if k.hasStatus {
		status := *store
		status.CreateStrategy = nil
		status.DeleteStrategy = nil
		ss := statusStrategy{st}
		status.UpdateStrategy = ss
		status.ResetFieldsStrategy = ss
		out[k.resource+"/status"] = &statusREST{store: &status}
	}
	for _, sub := range k.subresources {
		out[k.resource+"/"+sub.name] = sub.build(store)
	}
	if k.kube != nil {
		for name, kube := range k.kube.subresources {
			sub := *store
			sub.CreateStrategy, sub.DeleteStrategy = nil, nil
			adapted := k.kube.adapt(st, kube)
			sub.UpdateStrategy, sub.ResetFieldsStrategy = adapted, adapted
			out[k.resource+"/"+name] = &statusREST{store: &sub}
		}
	}
	return out, nil
}

// resource adds short names and categories to the library's registry store.
type resource struct {
	*genericregistry.Store
	k *kind
}

func (r *resource) ShortNames() []string { return r.k.shortNames }
func (r *resource) Categories() []string { return r.k.categories }

// statusREST is the status subresource: get, and update (or patch) of .status only.
type statusREST struct{ store *genericregistry.Store }

func (r *statusREST) New() runtime.Object { return r.store.New() }
func (r *statusREST) Destroy()            {}

func (r *statusREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, options)
}

func (r *statusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	// Status updates never create the object.
	return r.store.Update(ctx, name, objInfo, createValidation, updateValidation, false, options)
}

func (r *statusREST) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return r.store.GetResetFields()
}

func (r *statusREST) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	return r.store.ConvertToTable(ctx, object, tableOptions)
}
