package apiserver_test

import (
	"context"
	"net/http"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/apiserver"
)

// TestReviewsRefuseTables: a review is not a kind with a table; asking for its answer as a Table is 406 Not
// Acceptable, as on kube-apiserver (conformance: "should return a 406 for a backend which does not implement
// metadata").
func TestReviewsRefuseTables(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	client := kubernetes.NewForConfigOrDie(cfg)
	sar := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/", Verb: "get"}}}
	err := client.AuthorizationV1().RESTClient().Post().Resource("selfsubjectaccessreviews").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Body(sar).Do(context.Background()).Into(&metav1.Table{})
	if status, ok := err.(apierrors.APIStatus); !ok || status.Status().Code != http.StatusNotAcceptable {
		t.Fatalf("POST selfsubjectaccessreviews as Table: %v; want 406", err)
	}
	// Without the Table, the review answers.
	out, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), sar, metav1.CreateOptions{})
	if err != nil || !out.Status.Allowed {
		t.Fatalf("review: %+v, %v", out, err)
	}
}
