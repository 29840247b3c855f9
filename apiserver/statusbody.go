package apiserver

import (
	"encoding/json"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/responsewriter"
)

// withStatusBodies makes the errors the library's filters write as plain text (429 from the in-flight
// limits) carry a Kubernetes Status body instead, so that every error a client sees is a Status. Everything
// else passes through untouched, streaming included.
func withStatusBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(responsewriter.WrapForHTTP1Or2(&statusBodyWriter{ResponseWriter: w}), r)
	})
}

type statusBodyWriter struct {
	http.ResponseWriter
	replaced bool // the plain-text body is being dropped; the Status is written
}

func (w *statusBodyWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusBodyWriter) WriteHeader(code int) {
	if code != http.StatusTooManyRequests || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.replaced = true
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.ResponseWriter.WriteHeader(code)
	json.NewEncoder(w.ResponseWriter).Encode(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: int32(code), Reason: metav1.StatusReasonTooManyRequests,
		Message: "too many requests in flight, please try again later",
		Details: &metav1.StatusDetails{RetryAfterSeconds: 1},
	})
}

func (w *statusBodyWriter) Write(b []byte) (int, error) {
	if w.replaced {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}
