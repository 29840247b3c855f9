// Command operator is an operator written with controller-runtime, as kubebuilder scaffolds them, for Skiff's
// tests: it reconciles the custom resource Greeting (greetings.demo.skiff.dev, v1) into a ConfigMap of the
// same name that holds its message, owned by the Greeting so that the garbage collector removes it with the
// Greeting, and reports status.observedGeneration and status.configMap through the status subresource. It
// watches the ConfigMaps it owns, so one deleted or edited by hand is put back. It runs in a pod with the
// in-cluster configuration and takes a leader election Lease, as operators deployed with more than one
// replica do.
package main

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

var groupVersion = schema.GroupVersion{Group: "demo.skiff.dev", Version: "v1"}

// Greeting asks for a ConfigMap that holds a message.
type Greeting struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              GreetingSpec   `json:"spec"`
	Status            GreetingStatus `json:"status,omitempty"`
}

// GreetingSpec is what the user wants.
type GreetingSpec struct {
	Message string `json:"message"`
}

// GreetingStatus is what the operator did.
type GreetingStatus struct {
	ObservedGeneration int64  `json:"observedGeneration,omitempty"`
	ConfigMap          string `json:"configMap,omitempty"`
}

// GreetingList is a list of Greetings.
type GreetingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Greeting `json:"items"`
}

func (g *Greeting) DeepCopyObject() runtime.Object {
	out := *g
	g.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
}

func (l *GreetingList) DeepCopyObject() runtime.Object {
	out := *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	out.Items = make([]Greeting, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopyObject().(*Greeting)
	}
	return &out
}

// reconciler makes a Greeting's ConfigMap match its spec.
type reconciler struct {
	client.Client
	scheme *runtime.Scheme
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var g Greeting
	if err := r.Get(ctx, req.NamespacedName, &g); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !g.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // the garbage collector removes the ConfigMap
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: g.Name, Namespace: g.Namespace}}
	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, cm, func() error {
		cm.Data = map[string]string{"message": g.Spec.Message}
		return controllerutil.SetControllerReference(&g, cm, r.scheme)
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	if op != controllerutil.OperationResultNone {
		log.Info("configmap "+string(op), "configmap", cm.Name)
	}
	if g.Status.ObservedGeneration == g.Generation && g.Status.ConfigMap == cm.Name {
		return ctrl.Result{}, nil
	}
	g.Status = GreetingStatus{ObservedGeneration: g.Generation, ConfigMap: cm.Name}
	if err := r.Status().Update(ctx, &g); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{Requeue: true}, nil
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

func main() {
	ctrl.SetLogger(textlogger.NewLogger(textlogger.NewConfig()))
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fail(err)
	}
	scheme.AddKnownTypes(groupVersion, &Greeting{}, &GreetingList{})
	metav1.AddToGroupVersion(scheme, groupVersion)

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: ":8081",
		LeaderElection:         true,
		LeaderElectionID:       "greeting-operator.demo.skiff.dev",
	})
	if err != nil {
		fail(err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		fail(err)
	}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&Greeting{}).
		Owns(&corev1.ConfigMap{}).
		Complete(&reconciler{Client: mgr.GetClient(), scheme: scheme})
	if err != nil {
		fail(err)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "operator:", err)
	os.Exit(1)
}
