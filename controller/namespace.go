package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
)

// buildNamespaceController builds the controller that empties terminating namespaces, then removes the "kubernetes" finalizer through the
// finalize subresource, which lets the API server remove the namespace.
//
// For each namespace with a deletionTimestamp:
//  1. list the namespaced resources the API serves (discovery);
//  2. delete the pods first (ordered namespace deletion, KEP-5080): the rest of the content waits until no
//     pod is left, so a pod never outlives the Secrets, ConfigMaps and service accounts it runs with;
//  3. then delete every object of each other resource in the namespace (deletecollection);
//  4. write Kubernetes' deletion conditions to the namespace's status (what failed, what remains, which
//     finalizers hold it);
//  5. when none is left, finalize; otherwise requeue and look again shortly (pods with a grace period take
//     that long to go).
func buildNamespaceController(ctx context.Context, c *Clients) (func(), error) {
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
	return func() { queue.run(ctx, c, informer.HasSynced) }, nil
}

var podsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

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
	resources, skipped, err := namespacedResources(ctx, c)
	if err != nil {
		conditions := namespaceConditions{discovery: err}
		return false, errors.Join(err, conditions.write(ctx, c, ns))
	}
	conditions := namespaceConditions{discovery: skipped, remaining: map[string]int{}, finalizers: map[string]int{}}
	// Pods first; the rest once they are all gone.
	if slices.Contains(resources, podsResource) {
		conditions.deleteAll(ctx, c, name, podsResource)
	}
	if conditions.remaining[resourceName(podsResource)] == 0 {
		for _, gvr := range resources {
			if gvr != podsResource {
				conditions.deleteAll(ctx, c, name, gvr)
			}
		}
	}
	if err := conditions.write(ctx, c, ns); err != nil {
		return false, err
	}
	if len(conditions.failures) > 0 {
		return false, errors.New(strings.Join(conditions.failures, ", "))
	}
	if len(conditions.remaining) > 0 {
		return false, nil
	}
	// The status write moved the namespace on: finalize what it is now.
	ns, err = c.Kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	} else if err != nil {
		return false, err
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

// namespaceConditions is what one pass over a terminating namespace found, for Kubernetes' deletion
// conditions on its status.
type namespaceConditions struct {
	discovery  error          // groups whose resources could not be listed
	failures   []string       // deletions that failed
	remaining  map[string]int // objects found, by "resource.group"
	finalizers map[string]int // objects found holding each finalizer
}

func resourceName(gvr schema.GroupVersionResource) string { return gvr.Resource + "." + gvr.Group }

// deleteAll deletes every object of a resource in the namespace, counting what it found.
func (n *namespaceConditions) deleteAll(ctx context.Context, c *Clients, namespace string, gvr schema.GroupVersionResource) {
	client := c.Dynamic.Resource(gvr).Namespace(namespace)
	list, err := client.List(ctx, metav1.ListOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsMethodNotSupported(err) {
			n.failures = append(n.failures, fmt.Sprintf("failed to list %s: %v", resourceName(gvr), err))
		}
		return
	}
	if len(list.Items) == 0 {
		return
	}
	n.remaining[resourceName(gvr)] += len(list.Items)
	for _, item := range list.Items {
		for _, f := range item.GetFinalizers() {
			n.finalizers[f]++
		}
	}
	background := metav1.DeletePropagationBackground
	if err := client.DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &background}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		n.failures = append(n.failures, fmt.Sprintf("failed to delete %s: %v", resourceName(gvr), err))
	}
}

// write sets the namespace's deletion conditions as Kubernetes' namespace controller does (its types,
// reasons and messages), through the status subresource when they changed.
func (n *namespaceConditions) write(ctx context.Context, c *Clients, ns *corev1.Namespace) error {
	ok := func(t corev1.NamespaceConditionType, reason, message string) corev1.NamespaceCondition {
		return corev1.NamespaceCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: message}
	}
	failed := func(t corev1.NamespaceConditionType, reason, message string) corev1.NamespaceCondition {
		return corev1.NamespaceCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: message}
	}
	want := []corev1.NamespaceCondition{
		ok(corev1.NamespaceDeletionDiscoveryFailure, "ResourcesDiscovered", "All resources successfully discovered"),
		ok(corev1.NamespaceDeletionGVParsingFailure, "ParsedGroupVersions", "All legacy kube types successfully parsed"),
		ok(corev1.NamespaceDeletionContentFailure, "ContentDeleted", "All content successfully deleted, may be waiting on finalization"),
		ok(corev1.NamespaceContentRemaining, "ContentRemoved", "All content successfully removed"),
		ok(corev1.NamespaceFinalizersRemaining, "ContentHasNoFinalizers", "All content-preserving finalizers finished"),
	}
	if n.discovery != nil {
		msg := n.discovery.Error()
		var failedGroups *discovery.ErrGroupDiscoveryFailed
		if errors.As(n.discovery, &failedGroups) {
			msg = fmt.Sprintf("Discovery failed for some groups, %d failing: %v", len(failedGroups.Groups), n.discovery)
		}
		want[0] = failed(corev1.NamespaceDeletionDiscoveryFailure, "DiscoveryFailed", msg)
	}
	if len(n.failures) > 0 {
		msgs := slices.Sorted(slices.Values(n.failures))
		want[2] = failed(corev1.NamespaceDeletionContentFailure, "ContentDeletionFailed",
			fmt.Sprintf("Failed to delete all resource types, %d remaining: %v", len(msgs), strings.Join(msgs, ", ")))
	}
	if len(n.remaining) > 0 {
		var msgs []string
		for r, count := range n.remaining {
			msgs = append(msgs, fmt.Sprintf("%s has %d resource instances", r, count))
		}
		slices.Sort(msgs)
		want[3] = failed(corev1.NamespaceContentRemaining, "SomeResourcesRemain", "Some resources are remaining: "+strings.Join(msgs, ", "))
	}
	if len(n.finalizers) > 0 {
		var msgs []string
		for f, count := range n.finalizers {
			msgs = append(msgs, fmt.Sprintf("%s in %d resource instances", f, count))
		}
		slices.Sort(msgs)
		want[4] = failed(corev1.NamespaceFinalizersRemaining, "SomeFinalizersRemain",
			"Some content in the namespace has finalizers remaining: "+strings.Join(msgs, ", "))
	}
	updated := ns.DeepCopy()
	changed := false
	for _, w := range want {
		i := slices.IndexFunc(updated.Status.Conditions, func(c corev1.NamespaceCondition) bool { return c.Type == w.Type })
		switch {
		case i < 0:
			w.LastTransitionTime = metav1.Now()
			updated.Status.Conditions = append(updated.Status.Conditions, w)
			changed = true
		case updated.Status.Conditions[i].Status != w.Status || updated.Status.Conditions[i].Reason != w.Reason || updated.Status.Conditions[i].Message != w.Message:
			w.LastTransitionTime = updated.Status.Conditions[i].LastTransitionTime
			if updated.Status.Conditions[i].Status != w.Status {
				w.LastTransitionTime = metav1.Now()
			}
			updated.Status.Conditions[i] = w
			changed = true
		}
	}
	if !changed {
		return nil
	}
	_, err := c.Kube.CoreV1().Namespaces().UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// namespacedResources lists the namespaced resources that support list and deletecollection. A group whose
// discovery fails because its APIService is backed by a Service that does not answer (an extension API
// server that is down) is left out, so that one such server does not hold every namespace's deletion (which
// kube-apiserver's namespace controller does, kubernetes#60807); the objects such a server keeps in its own
// storage are its own to clean up. Any other discovery failure is retried.
func namespacedResources(ctx context.Context, c *Clients) (resources []schema.GroupVersionResource, skipped, err error) {
	lists, err := c.Discovery.ServerPreferredNamespacedResources()
	if err != nil {
		var failed *discovery.ErrGroupDiscoveryFailed
		if !errors.As(err, &failed) {
			return nil, nil, err
		}
		for gv := range failed.Groups {
			if !remoteAPIService(ctx, c, gv) {
				return nil, nil, err
			}
			c.Logger.Warn("namespace deletion goes on without an unavailable extension API", "group_version", gv.String())
		}
		skipped = err
	}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if hasVerbs(r.Verbs, "list", "deletecollection") {
				resources = append(resources, gv.WithResource(r.Name))
			}
		}
	}
	return resources, skipped, nil
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
