package apiserver

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/apis/scheduling"
	kubeschedulingv1 "k8s.io/kubernetes/pkg/apis/scheduling/v1"
	priorityclassregistry "k8s.io/kubernetes/pkg/registry/scheduling/priorityclass"
)

func init() {
	utilruntime.Must(scheduling.AddToScheme(kubeScheme))
	utilruntime.Must(kubeschedulingv1.AddToScheme(kubeScheme))
}

// priorityClassStrategies are kube-apiserver's: a PriorityClass's value and preemption policy never change,
// names starting with "system-" are the built-in classes' alone, and only they go above one billion.
var priorityClassStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &scheduling.PriorityClass{} },
	main:     priorityclassregistry.Strategy,
}

// systemPriorityClassesHook creates the built-in PriorityClasses (system-cluster-critical and
// system-node-critical) that are missing, as kube-apiserver's scheduling/bootstrap-system-priority-classes
// hook does. One that exists is left as it is.
func systemPriorityClassesHook(hook genericapiserver.PostStartHookContext) error {
	cfg := rest.CopyConfig(hook.LoopbackClientConfig)
	cfg.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for {
		err := createSystemPriorityClasses(hook, client)
		if err == nil {
			return nil
		}
		klog.InfoS("creating the system PriorityClasses", "err", err)
		select {
		case <-hook.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func createSystemPriorityClasses(ctx context.Context, client kubernetes.Interface) error {
	classes := client.SchedulingV1().PriorityClasses()
	for _, pc := range kubeschedulingv1.SystemPriorityClasses() {
		_, err := classes.Get(ctx, pc.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = classes.Create(ctx, pc, metav1.CreateOptions{})
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}
