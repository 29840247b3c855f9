package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/util/dryrun"
	"k8s.io/client-go/util/retry"
	pdbhelper "k8s.io/component-helpers/apps/poddisruptionbudget"
)

// Pods: eviction, a delete that honours PodDisruptionBudgets. These are the rules of kube-apiserver's
// eviction REST (k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go), written again over v1
// objects: kube's code runs on its internal Pod type against its own pod registry and a PDB client, so it
// cannot run on Skiff's stores. In short:
//
//   - a pod that is Pending, finished or already being deleted is deleted at once, no budget asked;
//   - a pod covered by more than one budget cannot be evicted (500);
//   - a pod that is not Ready is deleted without spending the budget if the budget says AlwaysAllow, or
//     if the budget is met without it (IfHealthyBudget, the default); the delete is then conditional on
//     the pod's resourceVersion, and refused with 429 if the pod changed meanwhile;
//   - otherwise the budget must have status.disruptionsAllowed > 0 (and be observed at its generation):
//     one disruption is spent and the pod recorded in status.disruptedPods by a resourceVersion-checked
//     status update, retried on conflict; else 429 "Cannot evict pod as it would violate the pod's
//     disruption budget." with the budget's reason as a cause;
//   - the pod gets the DisruptionTarget condition, then is deleted gracefully with the eviction's options;
//   - a dry run checks all of it but spends nothing and changes nothing.

// maxDisruptedPodSize is kube's MaxDisruptedPodSize: past this many evictions the disruption controller
// has not yet seen, evictions are refused.
const maxDisruptedPodSize = 2000

// evictionsRetry is kube's EvictionsRetry, for conflicts with other writers of the pod or the budget.
var evictionsRetry = wait.Backoff{Steps: 20, Duration: 500 * time.Millisecond, Factor: 1.0, Jitter: 0.1}

// budgetStores are the PodDisruptionBudgets' main store (to list them) and their status subresource (to
// spend a disruption).
type budgetStores struct {
	main   *genericregistry.Store
	status rest.Updater
}

type evictionREST struct {
	store *genericregistry.Store
	// budgets is set once the policy group's stores exist (installAPIs).
	budgets *budgetStores
}

func (r *evictionREST) New() runtime.Object { return &policyv1.Eviction{} }
func (r *evictionREST) Destroy()            {}

// GroupVersionKind tells the installer that pods/eviction takes a policy/v1 Eviction.
func (r *evictionREST) GroupVersionKind(schema.GroupVersion) schema.GroupVersionKind {
	return policyv1.SchemeGroupVersion.WithKind("Eviction")
}

func (r *evictionREST) Create(ctx context.Context, name string, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	eviction := obj.(*policyv1.Eviction)
	if eviction.Name != name {
		return nil, apierrors.NewBadRequest("name in URL does not match name in Eviction object")
	}
	if o := eviction.DeleteOptions; o != nil && o.IgnoreStoreReadErrorWithClusterBreakingPotential != nil && *o.IgnoreStoreReadErrorWithClusterBreakingPotential {
		return nil, apierrors.NewInvalid(policyv1.SchemeGroupVersion.WithKind("Eviction").GroupKind(), name, field.ErrorList{
			field.Invalid(field.NewPath("deleteOptions", "ignoreStoreReadErrorWithClusterBreakingPotential"), true, "can not be set for pod eviction, try after removing the option")})
	}
	deleteOptions, err := propagateDryRun(eviction, options)
	if err != nil {
		return nil, err
	}
	if createValidation != nil {
		if err := createValidation(ctx, eviction.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	evicted := &metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusCreated}

	// A pod the budgets need not guard is deleted at once; conflicts are retried unless the caller gave a
	// resourceVersion precondition.
	shouldRetry := apierrors.IsConflict
	if !resourceVersionIsUnset(deleteOptions) {
		shouldRetry = func(error) bool { return false }
	}
	var pod *corev1.Pod
	deleted := false
	err = retry.OnError(evictionsRetry, shouldRetry, func() error {
		got, err := r.store.Get(ctx, name, &metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod = got.(*corev1.Pod)
		if !canIgnorePDB(pod) {
			return nil
		}
		opts := deleteOptions
		if shouldEnforceResourceVersion(pod) && resourceVersionIsUnset(deleteOptions) {
			opts = opts.DeepCopy()
			setPreconditionsResourceVersion(opts, pod.ResourceVersion)
		}
		if err := r.markAndDelete(ctx, name, opts); err != nil {
			return err
		}
		deleted = true
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case deleted:
		return evicted, nil
	}

	var pdbName string
	unhealthyDelete := false
	var refused *metav1.Status
	err = func() error {
		pdbs, err := r.podBudgets(ctx, pod)
		if err != nil {
			return err
		}
		if len(pdbs) > 1 {
			refused = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
				Message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}
			return nil
		}
		if len(pdbs) == 0 {
			return nil
		}
		pdb := &pdbs[0]
		pdbName = pdb.Name
		if !podReady(pod) {
			// An unready pod does not count towards currentHealthy: deleting it spends nothing, if the
			// budget allows unhealthy pods to go or is met without this one.
			if p := pdb.Spec.UnhealthyPodEvictionPolicy; p != nil && *p == policyv1.AlwaysAllow {
				unhealthyDelete = true
				return nil
			}
			if pdb.Status.CurrentHealthy >= pdb.Status.DesiredHealthy && pdb.Status.DesiredHealthy > 0 {
				unhealthyDelete = true
				return nil
			}
		}
		refresh := false
		return retry.RetryOnConflict(evictionsRetry, func() error {
			if refresh {
				got, err := r.budgets.main.Get(genericapirequest.WithNamespace(ctx, pod.Namespace), pdbName, &metav1.GetOptions{})
				if err != nil {
					return err
				}
				pdb = got.(*policyv1.PodDisruptionBudget)
			}
			if err := r.checkAndDecrement(ctx, pod.Name, pdb.DeepCopy(), dryrun.IsDryRun(deleteOptions.DryRun)); err != nil {
				refresh = true
				return err
			}
			return nil
		})
	}()
	if wait.Interrupted(err) {
		err = apierrors.NewTimeoutError(fmt.Sprintf("couldn't update PodDisruptionBudget %q due to conflicts", pdbName), 10)
	}
	if err != nil {
		return nil, err
	}
	if refused != nil {
		return refused, nil
	}

	// No budget, a disruption spent, or an unready pod the budget can spare: delete it. The unready pod must
	// not have become Ready since it was judged.
	opts := deleteOptions
	if unhealthyDelete {
		opts = opts.DeepCopy()
		setPreconditionsResourceVersion(opts, pod.ResourceVersion)
	}
	if err := r.markAndDelete(ctx, name, opts); err != nil {
		if apierrors.IsConflict(err) && unhealthyDelete && resourceVersionIsUnset(deleteOptions) {
			return nil, tooManyRequests(pdbName)
		}
		return nil, err
	}
	return evicted, nil
}

// propagateDryRun takes the request's dry-run into the eviction's delete options, refusing two that differ.
func propagateDryRun(eviction *policyv1.Eviction, options *metav1.CreateOptions) (*metav1.DeleteOptions, error) {
	var dryRun []string
	if options != nil {
		dryRun = options.DryRun
	}
	if eviction.DeleteOptions == nil {
		return &metav1.DeleteOptions{DryRun: dryRun}, nil
	}
	if len(eviction.DeleteOptions.DryRun) == 0 {
		eviction.DeleteOptions.DryRun = dryRun
		return eviction.DeleteOptions, nil
	}
	if len(dryRun) > 0 && !reflect.DeepEqual(dryRun, eviction.DeleteOptions.DryRun) {
		return nil, fmt.Errorf("Non-matching dry-run options in request and content: %v and %v", dryRun, eviction.DeleteOptions.DryRun)
	}
	return eviction.DeleteOptions, nil
}

// markAndDelete gives the pod the DisruptionTarget condition (unless a dry run) and deletes it with the
// eviction's options. The condition's write checks the options' preconditions itself, and moves a
// resourceVersion precondition on to the version it wrote.
func (r *evictionREST) markAndDelete(ctx context.Context, name string, options *metav1.DeleteOptions) error {
	if !dryrun.IsDryRun(options.DryRun) {
		key, err := r.store.KeyFunc(ctx, name)
		if err != nil {
			return err
		}
		out := &corev1.Pod{}
		err = r.store.Storage.GuaranteedUpdate(ctx, key, out, false, nil, storage.SimpleUpdate(func(o runtime.Object) (runtime.Object, error) {
			pod := o.(*corev1.Pod)
			if p := options.Preconditions; p != nil {
				if p.UID != nil && *p.UID != "" && *p.UID != pod.UID {
					return nil, apierrors.NewConflict(schema.GroupResource{Resource: "Pod"}, pod.Name,
						fmt.Errorf("the UID in the precondition (%s) does not match the UID in record (%s). The object might have been deleted and then recreated", *p.UID, pod.UID))
				}
				if p.ResourceVersion != nil && *p.ResourceVersion != "" && *p.ResourceVersion != pod.ResourceVersion {
					return nil, apierrors.NewConflict(schema.GroupResource{Resource: "Pod"}, pod.Name,
						fmt.Errorf("the ResourceVersion in the precondition (%s) does not match the ResourceVersion in record (%s). The object might have been modified", *p.ResourceVersion, pod.ResourceVersion))
				}
			}
			setDisruptionTarget(&pod.Status)
			return pod, nil
		}), false, nil)
		if err != nil {
			return err
		}
		if !resourceVersionIsUnset(options) {
			options = options.DeepCopy()
			setPreconditionsResourceVersion(options, out.ResourceVersion)
		}
	}
	_, _, err := r.store.Delete(ctx, name, rest.ValidateAllObjectFunc, options)
	return err
}

// setDisruptionTarget records that the eviction API is deleting the pod, as kube's eviction does.
func setDisruptionTarget(status *corev1.PodStatus) {
	c := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI",
		Message: "Eviction API: evicting", LastTransitionTime: metav1.Now()}
	for i := range status.Conditions {
		if status.Conditions[i].Type == c.Type {
			if status.Conditions[i].Status == c.Status {
				c.LastTransitionTime = status.Conditions[i].LastTransitionTime
			}
			status.Conditions[i] = c
			return
		}
	}
	status.Conditions = append(status.Conditions, c)
}

// canIgnorePDB: a pod not running (Pending, or finished) or already being deleted disrupts nothing more.
func canIgnorePDB(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed ||
		pod.Status.Phase == corev1.PodPending || pod.DeletionTimestamp != nil
}

// shouldEnforceResourceVersion: a pod that may still become Ready is deleted only as it was judged.
func shouldEnforceResourceVersion(pod *corev1.Pod) bool {
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed && pod.DeletionTimestamp == nil
}

func resourceVersionIsUnset(options *metav1.DeleteOptions) bool {
	return options.Preconditions == nil || options.Preconditions.ResourceVersion == nil
}

func setPreconditionsResourceVersion(options *metav1.DeleteOptions, rv string) {
	if options.Preconditions == nil {
		options.Preconditions = &metav1.Preconditions{}
	}
	options.Preconditions.ResourceVersion = &rv
}

// podReady is kube's IsPodReady, the budgets' notion of a healthy pod.
func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podBudgets are the PodDisruptionBudgets of the pod's namespace whose selector matches it, read afresh.
func (r *evictionREST) podBudgets(ctx context.Context, pod *corev1.Pod) ([]policyv1.PodDisruptionBudget, error) {
	if r.budgets == nil {
		return nil, nil
	}
	got, err := r.budgets.main.List(genericapirequest.WithNamespace(ctx, pod.Namespace), &metainternalversion.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []policyv1.PodDisruptionBudget
	for _, pdb := range got.(*policyv1.PodDisruptionBudgetList).Items {
		selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || pdb.Namespace != pod.Namespace {
			continue // an invalid selector matches no pod
		}
		if selector.Matches(labels.Set(pod.Labels)) {
			out = append(out, pdb)
		}
	}
	return out, nil
}

// tooManyRequests is kube's answer while a budget's status lags its spec, or while an unready pod changed
// under an eviction.
func tooManyRequests(pdbName string) error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause,
		Message: fmt.Sprintf("The disruption budget %s is still being processed by the server.", pdbName)})
	return err
}

// checkAndDecrement spends one of the budget's disruptions on the pod, or says why it cannot (kube's
// checkAndDecrement). The status update carries the budget's resourceVersion, so two evictions never
// spend the same disruption: the second gets a conflict and judges the budget again.
func (r *evictionREST) checkAndDecrement(ctx context.Context, podName string, pdb *policyv1.PodDisruptionBudget, dryRun bool) error {
	if pdb.Status.ObservedGeneration < pdb.Generation {
		return tooManyRequests(pdb.Name)
	}
	forbidden := func(reason, cause string) error {
		err := apierrors.NewForbidden(policyv1.Resource("poddisruptionbudget"), pdb.Name, errors.New(reason))
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause,
			Message: fmt.Sprintf("The disruption budget %s does not allow evicting pods currently: %s", pdb.Name, cause)})
		return err
	}
	if pdb.Status.DisruptionsAllowed < 0 {
		return forbidden("pdb disruptions allowed is negative", "pdb disruptions allowed is negative")
	}
	if len(pdb.Status.DisruptedPods) > maxDisruptedPodSize {
		return forbidden("DisruptedPods map too big - too many evictions not confirmed by PDB controller",
			"too many pending evictions not confirmed by PDB controller")
	}
	if pdb.Status.DisruptionsAllowed == 0 {
		err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		cond := meta.FindStatusCondition(pdb.Status.Conditions, policyv1.DisruptionAllowedCondition)
		var msg string
		switch {
		case cond != nil && cond.Status == metav1.ConditionFalse && cond.Message != "" && cond.Reason == policyv1.SyncFailedReason:
			msg = fmt.Sprintf("The disruption budget %s does not allow evicting pods currently because it failed sync: %s", pdb.Name, cond.Message)
		case pdb.Status.CurrentHealthy <= pdb.Status.DesiredHealthy:
			msg = fmt.Sprintf("The disruption budget %s needs %d healthy pods and has %d currently", pdb.Name, pdb.Status.DesiredHealthy, pdb.Status.CurrentHealthy)
		case cond != nil && cond.Status == metav1.ConditionFalse && cond.Message != "":
			msg = fmt.Sprintf("The disruption budget %s does not allow evicting pods currently (%s): %s", pdb.Name, cond.Reason, cond.Message)
		default:
			msg = fmt.Sprintf("The disruption budget %s does not allow evicting pods currently", pdb.Name)
		}
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause, Message: msg})
		return err
	}

	pdb.Status.DisruptionsAllowed--
	if pdb.Status.DisruptionsAllowed == 0 {
		pdbhelper.UpdateDisruptionAllowedCondition(pdb)
	}
	if dryRun {
		return nil
	}
	if pdb.Status.DisruptedPods == nil {
		pdb.Status.DisruptedPods = map[string]metav1.Time{}
	}
	// The disruption controller counts the pod as gone from now on; if it is not deleted within two
	// minutes, the controller forgets it.
	pdb.Status.DisruptedPods[podName] = metav1.Now()
	_, _, err := r.budgets.status.Update(genericapirequest.WithNamespace(ctx, pdb.Namespace), pdb.Name, rest.DefaultUpdatedObjectInfo(pdb),
		rest.ValidateAllObjectFunc, rest.ValidateAllObjectUpdateFunc, false, &metav1.UpdateOptions{})
	return err
}
