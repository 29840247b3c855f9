package admission

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/utils/lru"
)

// limitRanger is Kubernetes' LimitRanger admission, written again on v1 objects (the library's plugin casts
// to kube's internal types), with Kubernetes' messages. For each LimitRange of the namespace:
//   - mutating, on pod create: a container without a limit or request of a resource gets the Container
//     item's default (limit) and defaultRequest, and the pod the kubernetes.io/limit-ranger annotation naming
//     what was set;
//   - validating: each container's requests and limits within the Container item's min and max, with
//     maxLimitRequestRatio; the pod's sums within the Pod item's; a claim's storage request within the
//     PersistentVolumeClaim item's. A breach is a 403 naming every breach.
//
// LimitRanges themselves get Kubernetes' defaults (a Container item's default limit from max, defaultRequest
// from default, then min) and validation.
//
// As Kubernetes' does, when the informer holds no LimitRange for the namespace it looks the namespace's up
// live (a consistent list through the server's loopback client) and keeps the answer for 30 s: a LimitRange
// created just before a pod, which this server's informer may not have yet, still applies to it.
type limitRanger struct {
	*admission.Handler
	ranges corev1listers.LimitRangeLister
	client kubernetes.Interface
	// live holds liveRanges by namespace, at most liveLookupNamespaces of them.
	live *lru.Cache
	now  func() time.Time
}

// liveRanges are a namespace's LimitRanges as a live lookup found them, good until expires.
type liveRanges struct {
	ranges  []*corev1.LimitRange
	expires time.Time
}

// Kubernetes' LimitRanger's live-lookup cache: its size and how long an answer stands.
const (
	liveLookupNamespaces = 4096
	liveLookupTTL        = 30 * time.Second
)

var (
	_ admission.MutationInterface   = &limitRanger{}
	_ admission.ValidationInterface = &limitRanger{}
)

// limitRangerAnnotation lists on a pod what LimitRanger set, as Kubernetes does.
const limitRangerAnnotation = "kubernetes.io/limit-ranger"

func newLimitRanger(ranges corev1listers.LimitRangeLister, client kubernetes.Interface) *limitRanger {
	return &limitRanger{Handler: admission.NewHandler(admission.Create, admission.Update), ranges: ranges, client: client,
		live: lru.New(liveLookupNamespaces), now: time.Now}
}

// namespaceRanges are the namespace's LimitRanges: the informer's, or when it has none a live lookup's.
func (l *limitRanger) namespaceRanges(ctx context.Context, namespace string) ([]*corev1.LimitRange, error) {
	ranges, err := l.ranges.LimitRanges(namespace).List(labels.Everything())
	if err != nil || len(ranges) > 0 {
		return ranges, err
	}
	if v, ok := l.live.Get(namespace); ok && l.now().Before(v.(liveRanges).expires) {
		return v.(liveRanges).ranges, nil
	}
	list, err := l.client.CoreV1().LimitRanges(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("looking up the LimitRanges of namespace %s: %w", namespace, err)
	}
	ranges = make([]*corev1.LimitRange, 0, len(list.Items))
	for i := range list.Items {
		ranges = append(ranges, &list.Items[i])
	}
	l.live.Add(namespace, liveRanges{ranges: ranges, expires: l.now().Add(liveLookupTTL)})
	return ranges, nil
}

// limitItems are the namespace's LimitRange items of a type, in a stable order.
func (l *limitRanger) limitItems(ctx context.Context, namespace string, typ corev1.LimitType) ([]corev1.LimitRangeItem, error) {
	ranges, err := l.namespaceRanges(ctx, namespace)
	if err != nil {
		return nil, err
	}
	sort.Slice(ranges, func(i, j int) bool { return ranges[i].Name < ranges[j].Name })
	var items []corev1.LimitRangeItem
	for _, lr := range ranges {
		for _, item := range lr.Spec.Limits {
			if item.Type == typ {
				items = append(items, item)
			}
		}
	}
	return items, nil
}

// podResources tells whether a request sets a pod's resources: its creation, or a resize (pods/resize),
// which kube's LimitRanger defaults and checks as it does a new pod.
func podResources(a admission.Attributes) bool {
	return a.GetResource().GroupResource() == podsResource &&
		((a.GetOperation() == admission.Create && a.GetSubresource() == "") || (a.GetOperation() == admission.Update && a.GetSubresource() == "resize"))
}

func (l *limitRanger) Admit(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if !podResources(a) {
		return nil
	}
	pod, ok := a.GetObject().(*corev1.Pod)
	if !ok {
		return nil
	}
	items, err := l.limitItems(ctx, a.GetNamespace(), corev1.LimitTypeContainer)
	if err != nil {
		return admission.NewForbidden(a, err)
	}
	var set []string
	for _, item := range items {
		for _, group := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
			for i := range group {
				set = append(set, applyContainerDefaults(&group[i], item)...)
			}
		}
	}
	if len(set) > 0 {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[limitRangerAnnotation] = "LimitRanger plugin set: " + strings.Join(set, "; ")
	}
	return nil
}

// applyContainerDefaults gives a container the item's default limits and requests it lacks, and says what
// was set ("cpu, memory request for container app").
func applyContainerDefaults(c *corev1.Container, item corev1.LimitRangeItem) []string {
	fill := func(dst *corev1.ResourceList, defaults corev1.ResourceList) []string {
		var names []string
		for name, q := range defaults {
			if _, ok := (*dst)[name]; ok {
				continue
			}
			if *dst == nil {
				*dst = corev1.ResourceList{}
			}
			(*dst)[name] = q.DeepCopy()
			names = append(names, string(name))
		}
		sort.Strings(names)
		return names
	}
	// A request defaults to the container's own limit first (the API's defaulting), then to defaultRequest,
	// then to the default limit, as in Kubernetes.
	requests := item.DefaultRequest.DeepCopy()
	if requests == nil {
		requests = corev1.ResourceList{}
	}
	for name, q := range item.Default {
		if _, ok := requests[name]; !ok {
			requests[name] = q.DeepCopy()
		}
	}
	for name, q := range c.Resources.Limits {
		requests[name] = q.DeepCopy()
	}
	var out []string
	if names := fill(&c.Resources.Requests, requests); len(names) > 0 {
		out = append(out, fmt.Sprintf("%s request for container %s", strings.Join(names, ", "), c.Name))
	}
	if names := fill(&c.Resources.Limits, item.Default); len(names) > 0 {
		out = append(out, fmt.Sprintf("%s limit for container %s", strings.Join(names, ", "), c.Name))
	}
	return out
}

func (l *limitRanger) Validate(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if a.GetSubresource() != "" && !podResources(a) {
		return nil
	}
	var errs []error
	switch obj := a.GetObject().(type) {
	case *corev1.Pod:
		if !podResources(a) {
			return nil
		}
		items, err := l.limitItems(ctx, a.GetNamespace(), corev1.LimitTypeContainer)
		if err != nil {
			return admission.NewForbidden(a, err)
		}
		for _, item := range items {
			for _, group := range [][]corev1.Container{obj.Spec.InitContainers, obj.Spec.Containers} {
				for _, c := range group {
					errs = append(errs, checkLimits(item, corev1.LimitTypeContainer, c.Resources.Requests, c.Resources.Limits)...)
				}
			}
		}
		if items, err = l.limitItems(ctx, a.GetNamespace(), corev1.LimitTypePod); err != nil {
			return admission.NewForbidden(a, err)
		}
		requests, limits := podTotals(obj)
		for _, item := range items {
			errs = append(errs, checkLimits(item, corev1.LimitTypePod, requests, limits)...)
		}
	case *corev1.PersistentVolumeClaim:
		items, err := l.limitItems(ctx, a.GetNamespace(), corev1.LimitTypePersistentVolumeClaim)
		if err != nil {
			return admission.NewForbidden(a, err)
		}
		for _, item := range items {
			storage := corev1.ResourceList{}
			if q, ok := obj.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
				storage[corev1.ResourceStorage] = q
			}
			// A claim has no limit; min and max bound its request.
			errs = append(errs, checkLimits(item, corev1.LimitTypePersistentVolumeClaim, storage, storage)...)
		}
	default:
		return nil
	}
	if len(errs) > 0 {
		return admission.NewForbidden(a, utilerrors.NewAggregate(errs))
	}
	return nil
}

// podTotals are a pod's effective requests and limits: the sum over its containers, or an init
// container's if larger (init containers run one at a time, before the others).
func podTotals(pod *corev1.Pod) (requests, limits corev1.ResourceList) {
	total := func(get func(c corev1.Container) corev1.ResourceList) corev1.ResourceList {
		sum := corev1.ResourceList{}
		for _, c := range pod.Spec.Containers {
			for name, q := range get(c) {
				v := sum[name]
				v.Add(q)
				sum[name] = v
			}
		}
		for _, c := range pod.Spec.InitContainers {
			for name, q := range get(c) {
				if v, ok := sum[name]; !ok || q.Cmp(v) > 0 {
					sum[name] = q.DeepCopy()
				}
			}
		}
		return sum
	}
	return total(func(c corev1.Container) corev1.ResourceList { return c.Resources.Requests }),
		total(func(c corev1.Container) corev1.ResourceList { return c.Resources.Limits })
}

// checkLimits checks requests and limits against an item's min, max and maxLimitRequestRatio, in
// Kubernetes' words.
func checkLimits(item corev1.LimitRangeItem, typ corev1.LimitType, requests, limits corev1.ResourceList) []error {
	var errs []error
	for _, name := range sortedNames(item.Min) {
		min := item.Min[name]
		req, hasReq := requests[name]
		lim, hasLim := limits[name]
		// One error per resource and bound, the first that applies, as kube's LimitRanger words it.
		switch {
		case !hasReq:
			errs = append(errs, fmt.Errorf("minimum %s usage per %s is %s.  No request is specified", name, typ, min.String()))
		case req.Cmp(min) < 0:
			errs = append(errs, fmt.Errorf("minimum %s usage per %s is %s, but request is %s", name, typ, min.String(), req.String()))
		case hasLim && lim.Cmp(min) < 0:
			errs = append(errs, fmt.Errorf("minimum %s usage per %s is %s, but limit is %s", name, typ, min.String(), lim.String()))
		}
	}
	for _, name := range sortedNames(item.Max) {
		max := item.Max[name]
		req, hasReq := requests[name]
		lim, hasLim := limits[name]
		switch {
		case !hasLim:
			errs = append(errs, fmt.Errorf("maximum %s usage per %s is %s.  No limit is specified", name, typ, max.String()))
		case lim.Cmp(max) > 0:
			errs = append(errs, fmt.Errorf("maximum %s usage per %s is %s, but limit is %s", name, typ, max.String(), lim.String()))
		case hasReq && req.Cmp(max) > 0:
			errs = append(errs, fmt.Errorf("maximum %s usage per %s is %s, but request is %s", name, typ, max.String(), req.String()))
		}
	}
	for _, name := range sortedNames(item.MaxLimitRequestRatio) {
		ratio := item.MaxLimitRequestRatio[name]
		req, hasReq := requests[name]
		lim, hasLim := limits[name]
		switch {
		case !hasReq || req.IsZero():
			errs = append(errs, fmt.Errorf("%s max limit to request ratio per %s is %s, but no request is specified or request is 0", name, typ, ratio.String()))
		case !hasLim:
			errs = append(errs, fmt.Errorf("%s max limit to request ratio per %s is %s, but no limit is specified", name, typ, ratio.String()))
		default:
			actual := float64(lim.MilliValue()) / float64(req.MilliValue())
			if lim.Value() > apiresource.MaxMilliValue || req.Value() > apiresource.MaxMilliValue {
				actual = float64(lim.Value()) / float64(req.Value())
			}
			if actual > float64(ratio.MilliValue())/1000 {
				errs = append(errs, fmt.Errorf("%s max limit to request ratio per %s is %s, but provided ratio is %f", name, typ, ratio.String(), actual))
			}
		}
	}
	return errs
}

func sortedNames(rl corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(rl))
	for name := range rl {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	return names
}
