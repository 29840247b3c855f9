package apiserver

import (
	"reflect"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// Scheme holds every type the API serves. Codecs and ParameterCodec are built from it.
var (
	Scheme         = runtime.NewScheme()
	Codecs         = serializer.NewCodecFactory(Scheme)
	ParameterCodec = runtime.NewParameterCodec(Scheme)
)

// servedGroups are the API group versions and the functions that register their types. A group served in
// more than one version lists its versions in order of preference, the first being the one it is stored in
// and whose types are the group's internal version (autoscaling: v2, then v1, whose HorizontalPodAutoscalers
// the scheme converts, kinds_autoscaling.go).
var servedGroups = []struct {
	gv  schema.GroupVersion
	add func(*runtime.Scheme) error
}{
	{corev1.SchemeGroupVersion, corev1.AddToScheme},
	{appsv1.SchemeGroupVersion, appsv1.AddToScheme},
	{batchv1.SchemeGroupVersion, batchv1.AddToScheme},
	{discoveryv1.SchemeGroupVersion, discoveryv1.AddToScheme},
	{coordinationv1.SchemeGroupVersion, coordinationv1.AddToScheme},
	{eventsv1.SchemeGroupVersion, eventsv1.AddToScheme},
	{rbacv1.SchemeGroupVersion, rbacv1.AddToScheme},
	{schedulingv1.SchemeGroupVersion, schedulingv1.AddToScheme},
	{networkingv1.SchemeGroupVersion, networkingv1.AddToScheme},
	{nodev1.SchemeGroupVersion, nodev1.AddToScheme},
	{policyv1.SchemeGroupVersion, policyv1.AddToScheme},
	{autoscalingv2.SchemeGroupVersion, autoscalingv2.AddToScheme},
	{autoscalingv1.SchemeGroupVersion, autoscalingv1.AddToScheme},
	{authenticationv1.SchemeGroupVersion, authenticationv1.AddToScheme},
	{authorizationv1.SchemeGroupVersion, authorizationv1.AddToScheme},
	{certificatesv1.SchemeGroupVersion, certificatesv1.AddToScheme},
	{storagev1.SchemeGroupVersion, storagev1.AddToScheme},
	{admissionregistrationv1.SchemeGroupVersion, admissionregistrationv1.AddToScheme},
	{flowcontrolv1.SchemeGroupVersion, flowcontrolv1.AddToScheme},
	{storagemigrationv1.SchemeGroupVersion, storagemigrationv1.AddToScheme},
	{resourcev1.SchemeGroupVersion, resourcev1.AddToScheme},
}

func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	unversioned := []runtime.Object{&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{}}
	Scheme.AddUnversionedTypes(schema.GroupVersion{Group: "", Version: "v1"}, unversioned...)
	versions := map[string][]schema.GroupVersion{}
	for _, g := range servedGroups {
		utilruntime.Must(g.add(Scheme))
		versions[g.gv.Group] = append(versions[g.gv.Group], g.gv)
		utilruntime.Must(Scheme.SetVersionPriority(versions[g.gv.Group]...))
		registerAsInternal(g.gv)
	}
	registerFieldLabels()
	// As k8s.io/kubernetes' v1 defaults, applied when a request is decoded (so before admission: LimitRanger
	// sees a container's requests taken from its limits, as kube-apiserver's does).
	Scheme.AddTypeDefaultingFunc(&corev1.Pod{}, func(o any) { defaultRequestsFromLimits(o.(*corev1.Pod)) })
}

// registerAsInternal registers each versioned type of gv also as the group's internal version. The API
// machinery converts to the internal version and back; with the same Go type on both sides no conversion
// functions are needed. A kind the group's preferred version registered already keeps that version's type.
func registerAsInternal(gv schema.GroupVersion) {
	internal := schema.GroupVersion{Group: gv.Group, Version: runtime.APIVersionInternal}
	for kind, typ := range Scheme.KnownTypes(gv) {
		if Scheme.Recognizes(internal.WithKind(kind)) {
			continue // metav1's options and watch event have internal types of their own
		}
		Scheme.AddKnownTypeWithName(internal.WithKind(kind), reflect.New(typ).Interface().(runtime.Object))
	}
}
