# cython: language_level=3
"""grpc_retry._native: every compiled module of grpc_retry (the core and the drivers) linked into one shared
library, and what makes each of them from it (grpc_retry/_compiled.py's finder asks).

Why one library: a call goes through a dozen compiled modules, and a call's work is mostly cold by the time the
next call comes (grpcio's C-core and the kernel run in between). Each library of its own has its own pointers to
Python's objects (None, True, the types), its own copies of Cython's helpers and its own pages: one library
touches fewer of them per call. Measured against separate libraries, side by side with grpcio: 2-3% less client
CPU per call (bench/HISTORY.md, "One library").

Each module's C is compiled as Cython wrote it, its init function renamed (PyInit_<name> would clash: aio._call
and sync._call are both `_call`); setup.py writes the list, `native_modules.h`: GRPC_RETRY_MODULE(init, name)
for each module.
"""

cdef extern from *:
    """
    #include "native_modules.h"

    #define GRPC_RETRY_MODULE(init, name) PyObject *init(void);
    GRPC_RETRY_MODULES
    #undef GRPC_RETRY_MODULE

    typedef struct { const char *name; PyObject *(*init)(void); } grpc_retry_module;

    static const grpc_retry_module grpc_retry_modules[] = {
    #define GRPC_RETRY_MODULE(init, name) {name, init},
        GRPC_RETRY_MODULES
    #undef GRPC_RETRY_MODULE
        {NULL, NULL}
    };

    /* The module `spec` names, made by its init function: a definition (Cython's multi-phase init) becomes a
       module here, executed by grpc_retry_exec; a module made by a single-phase init is returned as it is. */
    static PyObject *grpc_retry_create(PyObject *spec) {
        PyObject *name = PyObject_GetAttrString(spec, "name");
        if (name == NULL) return NULL;
        const char *wanted = PyUnicode_AsUTF8(name);
        if (wanted == NULL) { Py_DECREF(name); return NULL; }
        for (const grpc_retry_module *m = grpc_retry_modules; m->name != NULL; m++) {
            if (strcmp(m->name, wanted) != 0) continue;
            Py_DECREF(name);
            PyObject *made = m->init();
            if (made == NULL || !PyObject_TypeCheck(made, &PyModuleDef_Type)) return made;
            return PyModule_FromDefAndSpec((PyModuleDef *)made, spec);
        }
        PyErr_Format(PyExc_ImportError, "grpc_retry._native has no module %R", name);
        Py_DECREF(name);
        return NULL;
    }

    static int grpc_retry_exec(PyObject *module) {
        PyModuleDef *def = PyModule_GetDef(module);
        if (def == NULL) { PyErr_Clear(); return 0; }  /* made by a single-phase init: nothing left to run */
        return PyModule_ExecDef(module, def);
    }

    static PyObject *grpc_retry_names(void) {
        PyObject *names = PyList_New(0);
        for (const grpc_retry_module *m = grpc_retry_modules; names != NULL && m->name != NULL; m++) {
            PyObject *name = PyUnicode_FromString(m->name);
            if (name == NULL || PyList_Append(names, name) < 0) Py_CLEAR(names);
            Py_XDECREF(name);
        }
        return names;
    }
    """
    object grpc_retry_create(object spec)
    int grpc_retry_exec(object module) except -1
    list grpc_retry_names()


def create(spec):
    """The module `spec` names (importlib's Loader.create_module)."""
    return grpc_retry_create(spec)


def exec_module(module):
    """Run the module's body (importlib's Loader.exec_module)."""
    grpc_retry_exec(module)


NAMES = frozenset(grpc_retry_names())  # the modules linked in, by their dotted names
