package apiserver

import (
	"context"
	"reflect"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// strategy is the create, update and delete strategy of one kind, driven by its entry in the registry table.
// Kinds with a status subresource get the Kubernetes rule: the main resource keeps the old status, and the
// status subresource (statusStrategy) keeps everything but the status.
type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
	k *kind
}

func newStrategy(k *kind) strategy {
	return strategy{ObjectTyper: Scheme, NameGenerator: names.SimpleNameGenerator, k: k}
}

func (s strategy) NamespaceScoped() bool { return s.k.namespaced }

func (s strategy) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	if s.k.hasStatus && !s.k.statusOnCreate {
		resetStatus(obj)
	}
	if s.k.defaults != nil {
		s.k.defaults(obj)
	}
	if s.k.prepareCreate != nil {
		s.k.prepareCreate(obj)
	}
	if hasSpec(obj) {
		if m, err := meta.Accessor(obj); err == nil {
			m.SetGeneration(1)
		}
	}
}

func (s strategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	if s.k.hasStatus {
		copyField(obj, old, "Status")
	}
	if s.k.defaults != nil {
		s.k.defaults(obj)
	}
	if s.k.prepareUpdate != nil {
		s.k.prepareUpdate(obj, old)
	}
	// metadata.generation counts changes of the desired state, so controllers can report in
	// status.observedGeneration which one they have acted on.
	if hasSpec(obj) {
		newMeta, err1 := meta.Accessor(obj)
		oldMeta, err2 := meta.Accessor(old)
		if err1 == nil && err2 == nil {
			generation := oldMeta.GetGeneration()
			if !apiequality.Semantic.DeepEqual(specOf(obj), specOf(old)) {
				generation++
			}
			newMeta.SetGeneration(generation)
		}
	}
}

// specOf is the object's Spec field, or nil when it has none.
func specOf(obj runtime.Object) any {
	v := reflect.ValueOf(obj).Elem().FieldByName("Spec")
	if !v.IsValid() {
		return nil
	}
	return v.Interface()
}

func hasSpec(obj runtime.Object) bool {
	return reflect.ValueOf(obj).Elem().FieldByName("Spec").IsValid()
}

func (s strategy) Validate(ctx context.Context, obj runtime.Object) field.ErrorList {
	errs := s.k.validateMeta(obj)
	if s.k.validate != nil {
		errs = append(errs, s.k.validate(obj)...)
	}
	if s.k.validateCreate != nil {
		errs = append(errs, s.k.validateCreate(obj)...)
	}
	return errs
}

func (s strategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	newMeta, _ := meta.Accessor(obj)
	oldMeta, _ := meta.Accessor(old)
	errs := apimachineryvalidation.ValidateObjectMetaAccessorUpdate(newMeta, oldMeta, field.NewPath("metadata"))
	errs = append(errs, s.k.validateMeta(obj)...)
	if s.k.validate != nil {
		errs = append(errs, s.k.validate(obj)...)
	}
	if s.k.validateUpdate != nil {
		errs = append(errs, s.k.validateUpdate(obj, old)...)
	}
	return errs
}

func (s strategy) WarningsOnCreate(ctx context.Context, obj runtime.Object) []string      { return nil }
func (s strategy) WarningsOnUpdate(ctx context.Context, obj, old runtime.Object) []string { return nil }
func (s strategy) Canonicalize(obj runtime.Object)                                        {}
func (s strategy) AllowCreateOnUpdate(ctx context.Context) bool                           { return false }
func (s strategy) AllowUnconditionalUpdate(ctx context.Context) bool                      { return true }

// CheckGracefulDelete gives kinds with a graceful-delete rule (pods) a grace period; others are deleted at
// once.
func (s strategy) CheckGracefulDelete(ctx context.Context, obj runtime.Object, options *metav1.DeleteOptions) bool {
	if s.k.gracefulDelete == nil {
		return false
	}
	return s.k.gracefulDelete(obj, options)
}

// GetResetFields tells server-side apply which fields this endpoint never changes.
func (s strategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	if !s.k.hasStatus {
		return nil
	}
	return map[fieldpath.APIVersion]*fieldpath.Set{
		fieldpath.APIVersion(s.k.gv.String()): fieldpath.NewSet(fieldpath.MakePathOrDie("status")),
	}
}

// statusStrategy is the strategy of the status subresource.
type statusStrategy struct{ strategy }

// PrepareForUpdate keeps what kube-apiserver's status strategies keep: the status and the metadata of the
// request, and everything else (the spec) from the stored object, with the metadata fields the kind's status
// endpoint may not change (statusKeepsMeta) taken from the stored object too.
func (s statusStrategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	dst, src := reflect.ValueOf(obj).Elem(), reflect.ValueOf(old).Elem()
	for i := 0; i < dst.NumField(); i++ {
		switch dst.Type().Field(i).Name {
		case "TypeMeta", "ObjectMeta", "Status":
		default:
			dst.Field(i).Set(src.Field(i))
		}
	}
	newMeta, err1 := meta.Accessor(obj)
	oldMeta, err2 := meta.Accessor(old)
	if err1 != nil || err2 != nil {
		return
	}
	for _, f := range s.k.statusKeepsMeta {
		statusMetaFields[f].keep(newMeta, oldMeta)
	}
}

// statusMetaFields are the metadata fields a kind's status endpoint may take from the stored object, with the
// path server-side apply resets.
var statusMetaFields = map[string]struct {
	keep func(obj, old metav1.Object)
	path fieldpath.Path
}{
	"labels":            {func(o, old metav1.Object) { o.SetLabels(old.GetLabels()) }, fieldpath.MakePathOrDie("metadata", "labels")},
	"ownerReferences":   {func(o, old metav1.Object) { o.SetOwnerReferences(old.GetOwnerReferences()) }, fieldpath.MakePathOrDie("metadata", "ownerReferences")},
	"deletionTimestamp": {func(o, old metav1.Object) { o.SetDeletionTimestamp(old.GetDeletionTimestamp()) }, fieldpath.MakePathOrDie("metadata", "deletionTimestamp")},
}

func (s statusStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	newMeta, _ := meta.Accessor(obj)
	oldMeta, _ := meta.Accessor(old)
	return apimachineryvalidation.ValidateObjectMetaAccessorUpdate(newMeta, oldMeta, field.NewPath("metadata"))
}

func (s statusStrategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	paths := []fieldpath.Path{fieldpath.MakePathOrDie("spec")}
	for _, f := range s.k.statusKeepsMeta {
		paths = append(paths, statusMetaFields[f].path)
	}
	return map[fieldpath.APIVersion]*fieldpath.Set{fieldpath.APIVersion(s.k.gv.String()): fieldpath.NewSet(paths...)}
}

func resetStatus(obj runtime.Object) {
	v := reflect.ValueOf(obj).Elem().FieldByName("Status")
	if v.IsValid() && v.CanSet() {
		v.Set(reflect.Zero(v.Type()))
	}
}

func copyField(dst, src runtime.Object, name string) {
	d := reflect.ValueOf(dst).Elem().FieldByName(name)
	s := reflect.ValueOf(src).Elem().FieldByName(name)
	if d.IsValid() && s.IsValid() && d.CanSet() {
		d.Set(s)
	}
}

func (k *kind) validateMeta(obj runtime.Object) field.ErrorList {
	m, err := meta.Accessor(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("metadata"), err)}
	}
	name := apimachineryvalidation.NameIsDNSSubdomain
	if k.validateName != nil {
		name = k.validateName
	}
	return apimachineryvalidation.ValidateObjectMetaAccessor(m, k.namespaced, name, field.NewPath("metadata"))
}

// attrFunc returns the labels and the fields a field selector may use: metadata.name and
// metadata.namespace for every kind, plus the kind's own.
func (k *kind) attrFunc(obj runtime.Object) (labels.Set, fields.Set, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil, err
	}
	fs := fields.Set{"metadata.name": m.GetName()}
	if k.namespaced {
		fs["metadata.namespace"] = m.GetNamespace()
	}
	if k.fields != nil {
		for name, value := range k.fields(obj) {
			fs[name] = value
		}
	}
	return labels.Set(m.GetLabels()), fs, nil
}

// predicate builds the selection predicate the registry filters with.
func (k *kind) predicate(label labels.Selector, fld fields.Selector) storage.SelectionPredicate {
	return storage.SelectionPredicate{Label: label, Field: fld, GetAttrs: k.attrFunc}
}
