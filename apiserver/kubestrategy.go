package apiserver

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/kubernetes/pkg/apis/core"
	kubecorev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	"k8s.io/kubernetes/pkg/capabilities"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Some kinds run Kubernetes' own registry strategies (k8s.io/kubernetes/pkg/registry/...): defaulting,
// validation with field paths, status and subresource rules, exactly as kube-apiserver has them. Those
// strategies work on kube's internal types, while Skiff stores and serves v1 objects; a kind's row names its
// strategies (kind.kube) and the adapter below converts each object to the internal type with kube's
// generated conversions, runs the strategy, and writes the result back.
//
// To give a kind kube's strategies: register kube's internal types of its group and kube's v1 conversions
// and defaults in kubeScheme (from the group's file), and set the row's kube field to a kubeStrategies value.

// Kube's pod validation (of pod templates here) refuses privileged containers unless the process allows them,
// as kube-apiserver's --allow-privileged does; Skiff's agents run them, its own pod validation admits them, and
// PodSecurity admission is where a cluster forbids them, as on kubeadm and k3s clusters.
func init() {
	capabilities.Initialize(capabilities.Capabilities{AllowPrivileged: true})
}

// kubeScheme knows kube's internal types of the groups whose strategies Skiff runs, their v1 types, and
// kube's conversions and defaulting functions between them. Each group's file registers its own.
var kubeScheme = runtime.NewScheme()

// kubeStrategy is what a kube registry strategy offers a store. Most also say which fields their endpoint
// resets (rest.ResetFieldsStrategy).
type kubeStrategy interface {
	rest.RESTCreateStrategy
	rest.RESTUpdateStrategy
}

// kubeStrategies are a kind's kube registry strategies, run on kube's internal type, in place of the table's.
type kubeStrategies struct {
	internal func() runtime.Object
	main     kubeStrategy
	// subresources are update-only subresources ("status" among them) and their strategies.
	subresources map[string]kubeStrategy
	// unsupported, when set, refuses on create what kube's validation allows but Skiff does not do.
	unsupported func(obj runtime.Object) field.ErrorList
}

// adapt wraps a kube strategy so that a store of v1 objects can run it; st supplies the object typer and
// the graceful-delete rule.
func (ks *kubeStrategies) adapt(st strategy, kube kubeStrategy) convertingStrategy {
	return convertingStrategy{strategy: st, kube: kube, ks: ks}
}

// convertingStrategy runs a kube strategy on the internal form of a stored v1 object. Before that, the v1
// object gets kube's defaults (kube-apiserver defaults while decoding a request; a request decoded by Skiff
// has them already, and defaulting twice changes nothing).
type convertingStrategy struct {
	strategy
	kube kubeStrategy
	ks   *kubeStrategies
}

func (s convertingStrategy) toInternal(obj runtime.Object) (runtime.Object, error) {
	in := s.ks.internal()
	if err := kubeScheme.Convert(obj, in, nil); err != nil {
		return nil, fmt.Errorf("converting %T to kube's internal type: %w", obj, err)
	}
	return in, nil
}

// fromInternal writes the internal object back into the v1 one.
func (s convertingStrategy) fromInternal(in, obj runtime.Object) {
	if err := kubeScheme.Convert(in, obj, nil); err != nil {
		utilruntime.HandleError(fmt.Errorf("converting %T back to v1: %w", in, err))
	}
}

func (s convertingStrategy) NamespaceScoped() bool { return s.kube.NamespaceScoped() }
func (s convertingStrategy) AllowCreateOnUpdate(ctx context.Context) bool {
	return s.kube.AllowCreateOnUpdate(ctx)
}
func (s convertingStrategy) AllowUnconditionalUpdate(ctx context.Context) bool {
	return s.kube.AllowUnconditionalUpdate(ctx)
}
func (s convertingStrategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	if r, ok := s.kube.(rest.ResetFieldsStrategy); ok {
		return r.GetResetFields()
	}
	return nil
}

// DefaultGarbageCollectionPolicy is the kube strategy's, when it has one (batch/v1 Jobs orphan their pods
// unless the delete asks otherwise); otherwise dependents are deleted, the registry's default.
func (s convertingStrategy) DefaultGarbageCollectionPolicy(ctx context.Context) rest.GarbageCollectionPolicy {
	if gc, ok := s.kube.(rest.GarbageCollectionDeleteStrategy); ok {
		return gc.DefaultGarbageCollectionPolicy(ctx)
	}
	return rest.DeleteDependents
}

// PrepareForCreate leaves an object that does not convert alone; Validate then reports why. The row's own
// defaults run first: they do what kube-apiserver does while decoding a request and the conversion into the
// v1 object does not undo (a Secret's write-only stringData folded into data and cleared).
func (s convertingStrategy) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	if s.k.defaults != nil {
		s.k.defaults(obj)
	}
	kubeScheme.Default(obj)
	if in, err := s.toInternal(obj); err == nil {
		s.kube.PrepareForCreate(ctx, in)
		s.fromInternal(in, obj)
	}
}

func (s convertingStrategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	if s.k.defaults != nil {
		s.k.defaults(obj)
	}
	kubeScheme.Default(obj)
	in, err1 := s.toInternal(obj)
	oldIn, err2 := s.toInternal(old)
	if err1 == nil && err2 == nil {
		s.kube.PrepareForUpdate(ctx, in, oldIn)
		s.fromInternal(in, obj)
	}
}

// Validate runs the strategy's handwritten validation, which kube-apiserver runs too. Kube's declarative
// validation (rest.DeclarativeValidation, tags on the v1 types) is not run: where it is enforced it stands
// in for handwritten errors that the handwritten code still reports (marked as covered), and the rules of
// these groups declared only that way in v1.37 are on the alpha Job scheduling field, which the strategy
// drops while its feature gate (WorkloadWithJob) is off.
func (s convertingStrategy) Validate(ctx context.Context, obj runtime.Object) field.ErrorList {
	in, err := s.toInternal(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := s.kube.Validate(ctx, in)
	if s.ks.unsupported != nil {
		errs = append(errs, s.ks.unsupported(obj)...)
	}
	return errs
}

func (s convertingStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	in, err := s.toInternal(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	oldIn, err := s.toInternal(old)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	return s.kube.ValidateUpdate(ctx, in, oldIn)
}

func (s convertingStrategy) WarningsOnCreate(ctx context.Context, obj runtime.Object) []string {
	if in, err := s.toInternal(obj); err == nil {
		return s.kube.WarningsOnCreate(ctx, in)
	}
	return nil
}

func (s convertingStrategy) WarningsOnUpdate(ctx context.Context, obj, old runtime.Object) []string {
	in, err1 := s.toInternal(obj)
	oldIn, err2 := s.toInternal(old)
	if err1 == nil && err2 == nil {
		return s.kube.WarningsOnUpdate(ctx, in, oldIn)
	}
	return nil
}

func (s convertingStrategy) Canonicalize(obj runtime.Object) {}

// fullKubeStrategy is a kube strategy whose reset fields (status) and garbage-collection policy a wrapper
// keeps.
type fullKubeStrategy interface {
	kubeStrategy
	rest.ResetFieldsStrategy
	rest.GarbageCollectionDeleteStrategy
}

// skiffTemplateLimits checks an internal pod template against Skiff's pod rules (validatePod), with the
// field paths under spec.template.
func skiffTemplateLimits(in *core.PodTemplateSpec) field.ErrorList {
	if in == nil {
		return nil // a kind whose template is optional (a ReplicationController's); its validation says when it is needed
	}
	var template corev1.PodTemplateSpec
	if err := kubecorev1.Convert_core_PodTemplateSpec_To_v1_PodTemplateSpec(in, &template, nil); err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("spec", "template"), err)}
	}
	var errs field.ErrorList
	for _, e := range validatePod(podFromTemplate(&template)) {
		e.Field = "spec.template." + e.Field
		errs = append(errs, e)
	}
	return errs
}

// templateLimited is a kube strategy whose kind holds a pod template (a Job's, a CronJob's), and that also
// checks, once kube's validation passes, that the template holds only what Skiff's agents run (validatePod,
// the rule Deployments and DaemonSets have), so that an object whose pods would all be refused is itself
// refused with 422.
type templateLimited struct {
	fullKubeStrategy
	// template is the internal object's pod template and the path of its field ("spec.template").
	template func(obj runtime.Object) (*core.PodTemplateSpec, string)
}

func (s templateLimited) Validate(ctx context.Context, obj runtime.Object) field.ErrorList {
	errs := s.fullKubeStrategy.Validate(ctx, obj)
	if len(errs) == 0 {
		errs = s.limits(obj)
	}
	return errs
}

func (s templateLimited) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	errs := s.fullKubeStrategy.ValidateUpdate(ctx, obj, old)
	if len(errs) == 0 {
		errs = s.limits(obj)
	}
	return errs
}

func (s templateLimited) limits(obj runtime.Object) field.ErrorList {
	template, path := s.template(obj)
	errs := skiffTemplateLimits(template)
	for _, e := range errs {
		e.Field = path + strings.TrimPrefix(e.Field, "spec.template")
	}
	return errs
}
