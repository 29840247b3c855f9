package apiserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
)

// crdKeyPrefix is where CustomResourceDefinitions are stored (the extensions server's keys, as in etcd).
const crdKeyPrefix = "/registry/apiextensions.k8s.io/customresourcedefinitions/"

// withPendingCustomResources answers a request for a custom resource that this server does not serve yet,
// but whose CustomResourceDefinition the cluster has Established, with 503 and Retry-After instead of the
// 404 of notFound: client-go and kubectl retry it. A CRD created through one server is Established there at
// once and reaches the others through Raft and their informers a few milliseconds later; kube-apiserver
// covers that window by holding every new CRD's Established condition for 5 s when it runs several servers.
// Here the window is closed where it shows: on the not-found path only, after a linearizable read, so a
// request never waits on a CRD that does not exist and a 404 stays a 404.
func withPendingCustomResources(backend raftstore.Backend, codecs runtime.NegotiatedSerializer, notFound http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := genericapirequest.RequestInfoFrom(r.Context())
		if !ok || !info.IsResourceRequest || info.APIGroup == "" || info.Resource == "" {
			notFound.ServeHTTP(w, r)
			return
		}
		name := info.Resource + "." + info.APIGroup
		pending, err := establishedCRDServes(r, backend, name, info.APIVersion)
		if err != nil || !pending {
			notFound.ServeHTTP(w, r)
			return
		}
		gv := info.APIGroup + "/" + info.APIVersion
		status := apierrors.NewServiceUnavailable(fmt.Sprintf("%s %s is defined by CustomResourceDefinition %s but not served by this server yet", gv, info.Resource, name))
		status.ErrStatus.Details = nil
		w.Header().Set("Retry-After", "1")
		responsewriters.ErrorNegotiated(status, codecs, apiextensionsv1.SchemeGroupVersion, w, r)
	})
}

// establishedCRDServes reads CRD name linearizably from the store and says whether it is Established and
// serves version.
func establishedCRDServes(r *http.Request, backend raftstore.Backend, name, version string) (bool, error) {
	value, found, err := raftstore.ReadKey(r.Context(), backend, crdKeyPrefix+name)
	if err != nil || !found {
		return false, err
	}
	// CRDs are stored as JSON; one encrypted at rest does not decode, and keeps the 404.
	var crd apiextensionsv1.CustomResourceDefinition
	if err := json.Unmarshal(value, &crd); err != nil {
		return false, err
	}
	if crd.DeletionTimestamp != nil || !slices.ContainsFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
		return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
	}) {
		return false, nil
	}
	return slices.ContainsFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool {
		return v.Name == version && v.Served
	}), nil
}
