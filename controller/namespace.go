package controller

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
)

// runNamespaceController empties terminating namespaces, then removes the "kubernetes" finalizer through the
// finalize subresource, which lets the API server remove the namespace.
//
// For each namespace with a deletionTimestamp:
//  1. list the namespaced resources the API serves (discovery);
//  2. delete every object of each in the namespace (deletecollection);
//  3. when none is left, finalize; otherwise requeue and look again shortly (pods with a grace period take
//     that long to go).
func runNamespaceController(ctx context.Context, c *Clients) {
	informer := c.Informers.Core().V1().Namespaces().Informer()
	queue := newKeyQueue(queueConfig{what: "namespace", logger: c.Logger.Named("namespace"),
		sync: func(ctx context.Context, name string) (time.Duration, error) {
			done, err := syncNamespace(ctx, c, name)
			if err == nil && !done {
				return time.Second, nil // pods with a grace period take that long to go
			}
			return 0, err
		}})
	enqueue := func(obj interface{}) {
		if ns, ok := obj.(*corev1.Namespace); ok && ns.DeletionTimestamp != nil {
			queue.add(ns.Name)
		}
	}
	informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj interface{}) { enqueue(obj) },
	})
	queue.run(ctx, c, informer.HasSynced)
}

func syncNamespace(ctx context.Context, c *Clients, name string) (bool, error) {
	ns, err := c.Kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if ns.DeletionTimestamp == nil {
		return true, nil
	}
	resources, err := namespacedResources(ctx, c)
	if err != nil {
		return false, err
	}
	remaining := 0
	for _, gvr := range resources {
		client := c.Dynamic.Resource(gvr).Namespace(name)
		list, err := client.List(ctx, metav1.ListOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
				continue
			}
			return false, err
		}
		if len(list.Items) == 0 {
			continue
		}
		remaining += len(list.Items)
		background := metav1.DeletePropagationBackground
		if err := client.DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &background}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
	}
	if remaining > 0 {
		return false, nil
	}
	var keep []corev1.FinalizerName
	for _, f := range ns.Spec.Finalizers {
		if f != corev1.FinalizerKubernetes {
			keep = append(keep, f)
		}
	}
	ns.Spec.Finalizers = keep
	if _, err := c.Kube.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	c.Logger.Info("namespace emptied and finalized", "namespace", name)
	return true, nil
}

// namespacedResources lists the namespaced resources that support list and deletecollection. A group whose
// discovery fails because its APIService is backed by a Service that does not answer (an extension API
// server that is down) is left out, so that one such server does not hold every namespace's deletion (which
// kube-apiserver's namespace controller does, kubernetes#60807); the objects such a server keeps in its own
// storage are its own to clean up. Any other discovery failure is retried.
func namespacedResources(ctx context.Context, c *Clients) ([]schema.GroupVersionResource, error) {
	lists, err := c.Discovery.ServerPreferredNamespacedResources()
	if err != nil {
		var failed *discovery.ErrGroupDiscoveryFailed
		if !errors.As(err, &failed) {
			return nil, err
		}
		for gv := range failed.Groups {
			if !remoteAPIService(ctx, c, gv) {
				return nil, err
			}
			c.Logger.Warn("namespace deletion goes on without an unavailable extension API", "group_version", gv.String())
		}
	}
	var out []schema.GroupVersionResource
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if hasVerbs(r.Verbs, "list", "deletecollection") {
				out = append(out, gv.WithResource(r.Name))
			}
		}
	}
	return out, nil
}

func hasVerbs(verbs metav1.Verbs, want ...string) bool {
	for _, w := range want {
		found := false
		for _, v := range verbs {
			found = found || v == w
		}
		if !found {
			return false
		}
	}
	return true
}

var apiServices = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// remoteAPIService tells whether gv is served by an APIService backed by a Service (an extension API server).
func remoteAPIService(ctx context.Context, c *Clients, gv schema.GroupVersion) bool {
	s, err := c.Dynamic.Resource(apiServices).Get(ctx, gv.Version+"."+gv.Group, metav1.GetOptions{})
	if err != nil {
		return false
	}
	_, found, _ := unstructured.NestedMap(s.Object, "spec", "service")
	return found
}
