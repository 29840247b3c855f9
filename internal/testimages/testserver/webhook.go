package main

import (
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The admission webhook side of the test server, for tests of the API server's admission webhooks with a real
// webhook in a pod. Both endpoints take an admission.k8s.io/v1 AdmissionReview and answer one with the
// request's uid, or 400 if the body is not one:
//
//	POST /validate   denies an object labelled webhook-test=deny (403, denyMessage), allows anything else
//	POST /mutate     allows, and adds the label webhook-test-mutated=true with a JSON patch
//
// The API server only calls webhooks over HTTPS: main serves these (and the rest) on -webhook-port too.

const (
	denyLabel    = "webhook-test"
	denyValue    = "deny"
	mutatedLabel = "webhook-test-mutated"
	denyMessage  = "the test webhook refuses objects labelled webhook-test=deny"
)

func registerWebhook(mux *http.ServeMux) {
	mux.HandleFunc("POST /validate", validate)
	mux.HandleFunc("POST /mutate", mutate)
}

// objectMeta is the part of a reviewed object the webhook looks at. Metadata is a pointer and Labels a map so
// that a missing metadata and missing labels tell apart from empty ones: a JSON patch must create what is
// missing.
type objectMeta struct {
	Metadata *struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
}

func (o objectMeta) labels() map[string]string {
	if o.Metadata == nil {
		return nil
	}
	return o.Metadata.Labels
}

// readReview decodes the AdmissionReview of the request and the metadata of its object (none for a DELETE,
// whose object is empty). On an error it has answered 400.
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, objectMeta, bool) {
	var review admissionv1.AdmissionReview
	var obj objectMeta
	err := json.NewDecoder(r.Body).Decode(&review)
	switch {
	case err != nil:
		err = fmt.Errorf("not an AdmissionReview: %w", err)
	case review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview":
		err = fmt.Errorf("not an %s AdmissionReview: apiVersion %q, kind %q", admissionv1.SchemeGroupVersion, review.APIVersion, review.Kind)
	case review.Request == nil || review.Request.UID == "":
		err = fmt.Errorf("the AdmissionReview has no request uid")
	case len(review.Request.Object.Raw) > 0:
		if err = json.Unmarshal(review.Request.Object.Raw, &obj); err != nil {
			err = fmt.Errorf("the request's object: %w", err)
		}
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, obj, false
	}
	return &review, obj, true
}

// answer writes resp as the response to review, which keeps the apiVersion and kind the API server sent:
// it checks both.
func answer(w http.ResponseWriter, review *admissionv1.AdmissionReview, resp admissionv1.AdmissionResponse) {
	resp.UID = review.Request.UID
	writeJSON(w, admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: &resp})
}

func validate(w http.ResponseWriter, r *http.Request) {
	review, obj, ok := readReview(w, r)
	if !ok {
		return
	}
	if obj.labels()[denyLabel] == denyValue {
		answer(w, review, admissionv1.AdmissionResponse{
			Result: &metav1.Status{Code: http.StatusForbidden, Message: denyMessage},
		})
		return
	}
	answer(w, review, admissionv1.AdmissionResponse{Allowed: true})
}

func mutate(w http.ResponseWriter, r *http.Request) {
	review, obj, ok := readReview(w, r)
	if !ok {
		return
	}
	if len(review.Request.Object.Raw) == 0 { // a DELETE: nothing to label
		answer(w, review, admissionv1.AdmissionResponse{Allowed: true})
		return
	}
	patch, err := json.Marshal(labelPatch(obj))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	patchType := admissionv1.PatchTypeJSONPatch
	answer(w, review, admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &patchType})
}

// patchOp is one operation of a JSON patch (RFC 6902).
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// labelPatch adds the mutatedLabel to obj. An "add" needs the parent of its path to exist, so the patch adds
// the labels map, or the whole metadata, when obj lacks them. The label's name needs no JSON Pointer escaping
// (it has no "~" or "/").
func labelPatch(obj objectMeta) []patchOp {
	labels := map[string]string{mutatedLabel: "true"}
	switch {
	case obj.Metadata == nil:
		return []patchOp{{Op: "add", Path: "/metadata", Value: map[string]any{"labels": labels}}}
	case obj.Metadata.Labels == nil:
		return []patchOp{{Op: "add", Path: "/metadata/labels", Value: labels}}
	default:
		return []patchOp{{Op: "add", Path: "/metadata/labels/" + mutatedLabel, Value: "true"}}
	}
}
