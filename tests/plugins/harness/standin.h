/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * A stand-in libnvinfer for host-side plugin tests (no GPU, no TensorRT runtime). It exports the two
 * TensorRT symbols the attnres plugin libraries may import, getPluginRegistry and getLogger, implemented
 * minimally against the TensorRT headers it is compiled with, plus this C API (prefix attnresStandin) for the
 * harness and for Python (ctypes) to see what the plugin libraries did.
 *
 * The registry records every registerCreator(creator, namespace) call; like TensorRT it refuses a second
 * creator with the same name, version and namespace. loadLibrary does what IPluginRegistry::loadLibrary is
 * documented to do: dlopen the library, hand setLoggerFinder (when exported) a logger finder, call
 * getCreators and register each creator under the namespace it reports.
 */
#ifndef ATTNRES_STANDIN_H
#define ATTNRES_STANDIN_H

#include <cstdint>

#define ATTNRES_STANDIN_API extern "C" __attribute__((visibility("default")))

//! Number of registerCreator calls that were accepted (deregistered ones included).
ATTNRES_STANDIN_API int32_t attnresStandinRegistrations();

//! The namespace argument of accepted registration i (nullptr when out of range).
ATTNRES_STANDIN_API char const* attnresStandinRegistrationNamespace(int32_t i);

//! The creator of accepted registration i, as an IPluginCreatorInterface* (nullptr when out of range).
ATTNRES_STANDIN_API void* attnresStandinRegistrationCreator(int32_t i);

//! registerCreator calls the registry refused (duplicates).
ATTNRES_STANDIN_API int32_t attnresStandinRefusedRegistrations();

//! Messages logged through getLogger() or the finder's logger, oldest first.
ATTNRES_STANDIN_API int32_t attnresStandinLogCount();
ATTNRES_STANDIN_API char const* attnresStandinLogMessage(int32_t i);
ATTNRES_STANDIN_API int32_t attnresStandinLogSeverity(int32_t i);
ATTNRES_STANDIN_API void attnresStandinClearLog();

//! Calls of getLogger() and getPluginRegistry() (imported by libattnres_trt.so only).
ATTNRES_STANDIN_API int32_t attnresStandinGetLoggerCalls();
ATTNRES_STANDIN_API int32_t attnresStandinGetPluginRegistryCalls();

//! Calls of a library's setLoggerFinder by loadLibrary.
ATTNRES_STANDIN_API int32_t attnresStandinSetLoggerFinderCalls();

//! getPluginRegistry()->loadLibrary(path): the handle, or nullptr (logged) when it fails.
ATTNRES_STANDIN_API void* attnresStandinLoadLibrary(char const* path);

#endif // ATTNRES_STANDIN_H
